"""A table of images in natural clients: section ``[table]`` (``dcco.data.tables`` reads
it)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TableConfig:
    """A table of images in natural clients (section ``[table]``; used by
    ``data.dataset = "client_table"``, and for its image settings by ``ham10000``)."""

    file: str | None = None
    """The table, a ``.csv`` or ``.parquet`` file: a path, or a name in the data folder."""
    test_file: str | None = None
    """A second table holding the test split (e.g. Hugging Face's ``test-*.parquet``);
    None: one table, split by ``split_column`` or by clients."""
    image_column: str = "image"
    """The column of each row's image: a file path (relative to the image folders) or
    encoded bytes."""
    label_column: str = "label"
    """The column of each row's class label (integers or names)."""
    client_column: str = "client"
    """The column of each row's client id (a patient, a lesion, a phone)."""
    split_column: str | None = None
    """A column of ``train`` / ``test``; None: a seeded split by client."""
    image_folders: tuple[str, ...] = (".",)
    """Folders (relative to the table's) searched, in order, for a path in the image column."""
    image_suffix: str = ""
    """Appended to the image column's value to make the file name (e.g. ``.jpg``)."""
    image_size: tuple[int, int] = (32, 32)
    """(H, W) every image is resized to, once, when the table is decoded."""
    channels: int = 3
    """3 (RGB) or 1 (grey)."""
    test_fraction: float = 0.2
    """The share of clients in the test split, when the table gives no split."""
    split_seed: int = 0
    """Seeds the split by client (not the run seed: every run tests on the same clients)."""

    def __post_init__(self) -> None:
        if len(self.image_size) != 2 or min(self.image_size) < 4:
            raise ValueError(f"table.image_size must be [H, W] with both >= 4, got "
                             f"{list(self.image_size)}")
        if self.channels not in (1, 3):
            raise ValueError(f"table.channels must be 1 or 3, got {self.channels}")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"table.test_fraction must lie in (0, 1), got "
                             f"{self.test_fraction}")
        if not self.image_folders:
            raise ValueError("table.image_folders must name at least one folder ('.': the "
                             "table's own)")


def ham10000_table(cfg: TableConfig) -> TableConfig:
    """``cfg`` with HAM10000's files and columns (its image settings kept)."""
    return replace(cfg, file="HAM10000_metadata.csv", test_file=None, image_column="image_id",
                   label_column="dx", client_column="lesion_id", split_column=None,
                   image_folders=("HAM10000_images_part_1", "HAM10000_images_part_2", "."),
                   image_suffix=".jpg")
