"""Task data (host side, no jax): CM2 checklist records, the demo task generator, the grain prompt
pipeline and the array_record dataset builder. Names load from their modules on first use (the
pipeline needs grain)."""

from envace_jax._lazy import lazy_exports

_EXPORTS = {
    # records
    "RecordError": "envace_jax.data.records",
    "load_records": "envace_jax.data.records",
    "validate_record": "envace_jax.data.records",
    # demo tasks
    "generate_tasks": "envace_jax.data.demo_tasks",
    "demo_corpus": "envace_jax.data.demo_tasks",
    # the prompt pipeline
    "PipelineConfig": "envace_jax.data.pipeline",
    "PromptIterator": "envace_jax.data.pipeline",
    "build_dataset": "envace_jax.data.pipeline",
    # array_record datasets
    "write_tfds": "envace_jax.data.tfds_builder",
    "read_split": "envace_jax.data.tfds_builder",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
