"""dcco: federated training of dual encoders on small non-IID clients.

Implements Distributed Cross Correlation Optimization (DCCO; Vemulapalli et al., ICLR 2023)
and the baselines the paper compares with, on a fast single-machine simulator.

Layers, dependencies flowing one way:
``stats``/``losses`` (pure math) → ``client`` (one client's work) → ``methods`` (federated
algorithms) → ``simulator`` (execution backend) → ``cli``.
"""

__version__ = "0.1.0"
