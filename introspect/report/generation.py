"""The sections a diff through generation adds to the reports (json, md, html).

Each returns nothing for a diff of one forward, so the reports of those do not change.
"""

from __future__ import annotations

import html
from dataclasses import asdict
from typing import Any

from introspect.diff.generation.records import Generated, StepDiff
from introspect.diff.generation.tables import token_text


def generation_json(result: Any) -> dict[str, Any]:
    """``steps``, ``caches`` and ``generated`` for the JSON report ({} without them)."""
    if not getattr(result, "step_rows", None):
        return {}
    generated: Generated | None = result.generated
    return {
        "steps": [{**asdict(r), "hints": list(r.hints)} for r in result.step_rows],
        "caches": [asdict(r) for r in result.cache_rows],
        "generated": None if generated is None else {
            "prompt": list(generated.prompt), "reference": list(generated.reference),
            "candidate": list(generated.candidate), "first_parting": generated.first_parting,
            "prompt_text": generated.prompt_text,
            "reference_pieces": list(generated.reference_pieces),
            "candidate_pieces": list(generated.candidate_pieces)},
    }


def generation_markdown(result: Any) -> list[str]:
    """The per-step table, in Markdown."""
    if not getattr(result, "step_rows", None):
        return []
    first = next((r for r in result.step_rows if not r.passed), None)
    lines = ["", "**Generation** (greedy; both sides fed the reference's tokens): "
             + (f"first divergent step {first.step}, {_md(_where(first) or 'failed')}."
                if first is not None else "every step within budget."), "",
             "| step | position | reference | candidate | logits max abs err | first divergent "
             "node / cache | status |", "|---:|---:|---|---|---:|---|---|"]
    for r in result.step_rows:
        lines.append(f"| {r.step} | {r.position} | {_md(token_text(r, 'reference'))} | "
                     f"{_md(token_text(r, 'candidate'))} | {r.logits_max_abs_err:.3g} | "
                     f"{_md(_where(r))} | {'pass' if r.passed else '**FAIL**'} |")
    if first is not None:
        lines += [f"- step {first.step} hint: {_md(h)}" for h in first.hints]
    return lines


def generation_html(result: Any) -> list[str]:
    """The two generated texts side by side, the first parting token marked, and the table."""
    if not getattr(result, "step_rows", None):
        return []
    e = html.escape
    first = next((r for r in result.step_rows if not r.passed), None)
    parts = ["<h2>Generation</h2>",
             f"<p>First divergent step: <b>{first.step}</b> (position {first.position}): "
             f"<code>{e(_where(first) or 'the step failed')}</code></p>" if first is not None
             else "<p>Every step within budget.</p>"]
    generated: Generated | None = result.generated
    if generated is not None:
        parting = generated.first_parting
        parts.append("<table class='generated'><thead><tr><th>reference</th><th>candidate"
                     "</th></tr></thead><tbody><tr>")
        for tokens, pieces in ((generated.reference, generated.reference_pieces),
                               (generated.candidate, generated.candidate_pieces)):
            shown = []
            for i, token in enumerate(tokens):
                text = pieces[i] if i < len(pieces) and pieces[i] else f" [{token}]"
                cell = e(text)
                if i == parting:
                    cell = (f"<mark title='first parting token: step {i}'>{cell}</mark>")
                shown.append(cell)
            parts.append(f"<td><span class='prompt'>{e(generated.prompt_text)}</span>"
                         f"{''.join(shown)}</td>")
        parts.append("</tr></tbody></table>")
        if parting is not None:
            parts.append(f"<p class='notes'>The chosen tokens part at step {parting} (marked); "
                         "from there both sides were fed the reference's tokens.</p>")
    rows = []
    for r in result.step_rows:
        style = "" if r.passed else " style='background-color:#f8d7da'"
        rows.append(f"<tr{style}><td>{r.step}</td><td>{r.position}</td>"
                    f"<td>{e(token_text(r, 'reference'))}</td>"
                    f"<td>{e(token_text(r, 'candidate'))}</td>"
                    f"<td>{r.logits_max_abs_err:.3g}</td><td>{e(_where(r))}</td>"
                    f"<td>{'pass' if r.passed else 'FAIL'}</td></tr>")
    parts.append("<table class='steps'><thead><tr><th>step</th><th>position</th><th>reference"
                 "</th><th>candidate</th><th>logits max abs err</th><th>first divergent node "
                 "/ cache</th><th>status</th></tr></thead><tbody>" + "".join(rows)
                 + "</tbody></table>")
    if first is not None:
        parts += [f"<p>&rarr; step {first.step}: {e(h)}</p>" for h in first.hints]
    return parts


def _where(row: StepDiff) -> str:
    node = row.first_node and f"{row.first_node} ({row.op} in {row.module or row.layer})"
    return "; ".join(x for x in (node, row.cache and f"cache: {row.cache}") if x)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


__all__ = ["generation_html", "generation_json", "generation_markdown"]
