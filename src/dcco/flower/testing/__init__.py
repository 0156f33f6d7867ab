"""Tools to test and measure dcco's Flower app, not part of it: ``inprocess`` (a Grid that
delivers messages to a ClientApp in this process), ``loopback`` (a real SuperLink and
SuperNodes on this machine, for deployment tests) and ``floor`` (Flower's own floor: rounds
of tiny messages, nothing else). The deployed apps never import them."""
