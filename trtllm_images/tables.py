"""What `build.py` prints: the matrix (`list`), the models (`models`, `models NAME`), as tables or as the JSON the
images carry, and the summary after a build. The tables are pure (loaded values in, text out); the listings read
capabilities.yaml and models.yaml."""

from __future__ import annotations

import json
from collections.abc import Sequence

from trtllm_images import model_support, report
from trtllm_images.capabilities import Capabilities, load_capabilities
from trtllm_images.matrix import Matrix, image_matrix_json, markdown_table

MATRIX_COLUMNS = (
    ("TAG", "tag"),
    ("STATUS", "status"),
    ("TRITON", "triton"),
    ("TRT-LLM", "tensorrt_llm"),
    ("TENSORRT", "tensorrt"),
    ("PYTHON", "python"),
    ("WORKFLOWS", "workflows"),
)


def table(rows: Sequence[tuple[str, ...]]) -> str:
    """Columns padded to their widest cell, two spaces apart; the first row is the heading."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def build_summary(records: Sequence[report.BuildRecord]) -> str:
    rows: list[tuple[str, ...]] = [("TAG", "RESULT", "IMAGES", "WARNINGS", "SECONDS")]
    for record in records:
        refs = ", ".join(image["ref"] for image in record.images) or "-"
        rows.append(
            (
                record.tag,
                "ok" if record.ok else "FAILED",
                refs,
                str(record.warning_count),
                f"{sum(record.durations.values()):.0f}",
            )
        )
    return table(rows)


def matrix_table(matrix: Matrix) -> str:
    """One row per NGC tag; `?` marks a value the matrix calls uncertain."""
    rows = [tuple(title for title, _ in MATRIX_COLUMNS) + ("NOTE",)]
    for entry in matrix.entries:
        cells = []
        for _, field in MATRIX_COLUMNS:
            value = getattr(entry, field)
            text = ",".join(value) if isinstance(value, tuple) else (value or "-")
            cells.append(text + ("?" if field in entry.uncertain else ""))
        rows.append(tuple(cells) + (entry.note,))
    return table(rows) + "\n\n? = uncertain: matrix.yaml says why under `uncertain:`"


def models_table(models: Sequence[model_support.ModelSupport], matrix: Matrix, capabilities: Capabilities) -> str:
    """One row per model: the first and last tag that serve it per workflow."""
    rows: list[tuple[str, ...]] = [("MODEL_TYPE", "ARCHITECTURES", "ENGINE TAGS", "LLMAPI TAGS")]
    for model in models:
        record = model_support.model_record(model, matrix, capabilities)
        spans = [_span(record[w]["tags"]) if record[w] else "-" for w in ("engine", "llmapi")]
        rows.append((model.model_type + ("?" if model.uncertain else ""), ",".join(model.architectures), *spans))
    return table(rows) + "\n\n? = uncertain: models.yaml says why under `uncertain:`"


def model_table(model: model_support.ModelSupport, matrix: Matrix, capabilities: Capabilities) -> str:
    """One model: a line on where its support starts, then per supported tag its converter folder and LLM API."""
    rows = [("TAG", "TRT-LLM", "ENGINE", "LLMAPI")]
    for entry in matrix.supported():
        caps = capabilities.of(entry)
        engine = model.serves(entry, caps, "engine")
        folder = model.converter_dir(caps.examples_layout) if engine else "-"
        rows.append(
            (entry.tag, entry.tensorrt_llm or "-", folder, "yes" if model.serves(entry, caps, "llmapi") else "-")
        )
    notes = [f"{key} is uncertain: {why}" for key, why in sorted(model.uncertain.items())]
    heading = (
        f"{model.model_type} ({', '.join(model.architectures)}): engine from TensorRT-LLM "
        f"{model.engine.since if model.engine else '(none)'}, llmapi from {model.llmapi_since or '(none)'}"
    )
    return f"{heading}\n\n" + table(rows) + "".join(f"\n{note}" for note in notes)


def _span(tags: list[str]) -> str:
    return f"{tags[0]}..{tags[-1]}" if tags else "none"


def matrix_listing(matrix: Matrix, *, as_json: bool, markdown: bool) -> str:
    """What `list` prints: the JSON the images carry, the table in docs/matrix.md, or the plain table."""
    if as_json:
        return image_matrix_json(matrix, load_capabilities())
    if markdown:
        return markdown_table(matrix)
    return matrix_table(matrix) + "\n"


def models_listing(matrix: Matrix, name: str | None, *, as_json: bool) -> str:
    """What `models` prints: every model (the models.json the images carry, or a table), or the one named."""
    capabilities, models = load_capabilities(), model_support.load_models()
    if name is None:
        if as_json:
            return model_support.models_json(models, matrix, capabilities)
        return models_table(models, matrix, capabilities) + "\n"
    model = model_support.find(models, name)
    if as_json:
        return json.dumps(model_support.model_record(model, matrix, capabilities), indent=2) + "\n"
    return model_table(model, matrix, capabilities) + "\n"
