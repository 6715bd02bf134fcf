"""Task records as a tensorflow-datasets dataset in array_record format (no TensorFlow needed).

Each example holds the record's ``uid`` and the whole validated record as one JSON string, so the
nested, heterogeneous fields (tool arguments, evidence dicts) survive without a fixed schema.
Only the array_record write path and ``as_data_source`` read path of tfds work without
TensorFlow; ``tfds.load`` and tfrecord do not, so we never touch them.

tfds shuffles examples on write (by a hash of the example key), so index order on disk is not the
caller's order; records are found by uid, and the grain pipeline shuffles again by seed anyway.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator, Mapping, Sequence

import tensorflow_datasets as tfds

VERSION = "1.0.0"
SPLITS = ("train", "validation", "test")


def _make_builder_cls(name: str, records_by_split: Mapping[str, Sequence[Mapping[str, Any]]] | None):
    """Builds a one-off GeneratorBasedBuilder subclass named ``name``.

    A class per call (unregistered) lets callers pick the dataset name, which tfds takes from the
    class, and lets the generator close over the caller's records.
    """

    def _info(self) -> tfds.core.DatasetInfo:
        # DatasetInfo(builder=...) rather than dataset_info_from_configs: the latter reads metadata
        # files from the builder's package directory, which a dynamic class does not have.
        return tfds.core.DatasetInfo(
            builder=self,
            description="EnvACE checklist task records (one JSON-encoded record per example).",
            features=tfds.features.FeaturesDict({"uid": tfds.features.Text(), "record": tfds.features.Text()}),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(recs) for split, recs in records_by_split.items()}

    def _generate_examples(self, recs) -> Iterator[tuple[str, dict[str, str]]]:
        for rec in recs:
            yield rec["uid"], {"uid": rec["uid"], "record": json.dumps(rec, ensure_ascii=False)}

    # code_path=None: tfds otherwise resolves the defining package's files to look for a
    # checksums file, which needs importlib_resources (not installed) and means nothing here.
    attrs = {
        "name": name,
        "code_path": None,
        "VERSION": tfds.core.Version(VERSION),
        "RELEASE_NOTES": {VERSION: "Initial layout."},
        "_info": _info,
        "_split_generators": _split_generators,
        "_generate_examples": _generate_examples,
        "__module__": __name__,
    }
    return type(f"_EnvaceRecords_{name}", (tfds.core.GeneratorBasedBuilder,), attrs, skip_registration=True)


def _check_name(name: str) -> None:
    if not name or not name.replace("_", "a").isalnum() or not name[0].isalpha() or name.lower() != name:
        raise ValueError(f"dataset name must be lower_snake_case starting with a letter, got {name!r}")


def dataset_dir(data_dir: str | os.PathLike, name: str) -> str:
    """Where ``write_tfds`` puts the dataset: ``data_dir/name/VERSION``."""
    return os.path.join(os.fspath(data_dir), name, VERSION)


def write_tfds(
    records_by_split: Mapping[str, Sequence[Mapping[str, Any]]],
    data_dir: str | os.PathLike,
    name: str = "envace_records",
) -> str:
    """Writes validated records (one list per split) as array_record files; returns the dataset dir.

    Split names are the caller's (usually train / validation / test). Uids must be unique within a
    split because tfds keys examples by them.
    """
    _check_name(name)
    if not records_by_split:
        raise ValueError("write_tfds: records_by_split is empty")
    for split, recs in records_by_split.items():
        if not isinstance(split, str) or not split.replace("_", "a").isalnum():
            raise ValueError(f"write_tfds: split name must be alphanumeric/underscore, got {split!r}")
        if not recs:
            raise ValueError(f"write_tfds: split {split!r} has no records")
        seen: set[str] = set()
        for i, rec in enumerate(recs):
            uid = rec.get("uid") if isinstance(rec, Mapping) else None
            if not isinstance(uid, str) or not uid:
                raise ValueError(f"write_tfds: split {split!r} record {i} has no string uid")
            if uid in seen:
                raise ValueError(f"write_tfds: split {split!r} record {i} repeats uid {uid!r}")
            seen.add(uid)
    out = dataset_dir(data_dir, name)
    if os.path.exists(os.path.join(out, "dataset_info.json")):
        raise FileExistsError(f"write_tfds: {out} already holds a dataset; pick another data_dir or name")
    cls = _make_builder_cls(name, records_by_split)
    builder = cls(data_dir=os.fspath(data_dir), file_format="array_record")
    builder.download_and_prepare()
    return out


def decode_example(example: Mapping[str, Any]) -> dict[str, Any]:
    """Turns one stored example (``Text`` features come back as bytes) into the record dict."""
    raw = example["record"]
    return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)


class RecordSource:
    """Random-access source of record dicts over one split (len, integer indexing)."""

    def __init__(self, raw_source, split: str):
        self._raw = raw_source
        self.split = split

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return decode_example(self._raw[index])

    @property
    def raw(self):
        """The underlying tfds ``ArrayRecordDataSource`` (examples as dicts of bytes)."""
        return self._raw

    def __repr__(self) -> str:
        return f"RecordSource(split={self.split!r}, len={len(self)})"


def split_names(data_dir: str | os.PathLike, name: str = "envace_records") -> list[str]:
    builder = tfds.builder_from_directory(dataset_dir(data_dir, name))
    return sorted(builder.info.splits.keys())


def read_split(data_dir: str | os.PathLike, name: str, split: str, *, decode: bool = True):
    """Opens one split for random access: a ``RecordSource`` of dicts, or with ``decode=False``
    the raw tfds data source (examples ``{"uid": bytes, "record": bytes}``) for grain to decode."""
    path = dataset_dir(data_dir, name)
    if not os.path.exists(os.path.join(path, "dataset_info.json")):
        raise FileNotFoundError(f"read_split: no dataset {name!r} under {os.fspath(data_dir)!r} (looked in {path})")
    builder = tfds.builder_from_directory(path)
    if split not in builder.info.splits:
        raise ValueError(
            f"read_split: dataset {name!r} has no split {split!r}; available: {sorted(builder.info.splits.keys())}"
        )
    raw = builder.as_data_source(split=split)
    return RecordSource(raw, split) if decode else raw
