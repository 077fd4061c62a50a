"""The estimators' data on a rank: its share of the Parquet row groups, read with pyarrow, and
the feature and label columns as numpy arrays. Framework-free, so every estimator reads alike.

Each rank reads every size()-th row group of the data, from its rank on; `fit` writes one file
per rank at least, so the shares differ by a row group at most.
"""

from typing import List, Sequence

import numpy as np

__all__ = ["columns_as_array", "labels_as_array", "read_arrays", "read_first_features", "read_share"]


def columns_as_array(table, columns: Sequence[str]) -> np.ndarray:
    """The columns of a pyarrow table (or a pandas DataFrame) as one float32 matrix: a column of
    numbers gives one feature, a column of arrays (or Spark ML vectors) as many as each holds."""
    parts = []
    for column in columns:
        values = _values(table, column)
        if values.dtype == object:  # arrays, one per row
            values = np.stack([np.asarray(value, dtype=np.float32) for value in values]) if len(values) else \
                np.zeros((0, 1), np.float32)
        parts.append(values.reshape(len(values), -1).astype(np.float32))
    return np.concatenate(parts, axis=1)


def labels_as_array(table, columns: Sequence[str]) -> np.ndarray:
    """The label columns: integer labels as int64 class indices (a vector for one column),
    others as float32."""
    values = np.column_stack([_values(table, column) for column in columns])
    if np.issubdtype(values.dtype, np.integer):
        return values.reshape(-1).astype(np.int64) if values.shape[1] == 1 else values.astype(np.int64)
    return values.astype(np.float32)


def _values(table, column: str) -> np.ndarray:
    values = table[column]
    # A pyarrow column hands its numbers over without a copy only when it has no nulls.
    return values.to_numpy(zero_copy_only=False) if hasattr(values, "combine_chunks") else values.to_numpy()


def read_share(path: str, rank: int, size: int, columns: List[str]):
    """This rank's row groups of the Parquet files under `path`, as one pyarrow table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset = pq.ParquetDataset(path)
    groups = [(fragment.path, group) for fragment in sorted(dataset.fragments, key=lambda f: f.path)
              for group in range(fragment.metadata.num_row_groups)]
    mine = groups[rank::size]
    tables = [pq.ParquetFile(file).read_row_group(group, columns=columns) for file, group in mine]
    return pa.concat_tables(tables) if tables else dataset.read(columns=columns).slice(0, 0)


def read_arrays(path: str, rank: int, size: int, feature_cols: Sequence[str], label_cols: Sequence[str]):
    """(features, labels) of this rank's share of `path`, as `columns_as_array` and
    `labels_as_array` give them."""
    table = read_share(path, rank, size, list(feature_cols) + list(label_cols))
    return columns_as_array(table, feature_cols), labels_as_array(table, label_cols)


def read_first_features(path: str, feature_cols: Sequence[str]) -> np.ndarray:
    """The features of the first row of the Parquet files under `path`, as `columns_as_array`
    gives them; no more of the files is read than that row."""
    import pyarrow.dataset as ds

    return columns_as_array(ds.dataset(path, format="parquet").head(1, columns=list(feature_cols)), feature_cols)
