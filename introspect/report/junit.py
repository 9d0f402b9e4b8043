"""JUnit XML for CI: one test case per layer of the reference, failing where a node fails."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from introspect.diff.records import STATUS_FAIL
from introspect.diff.status import WORD_NA, layer_statuses

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult


def junit_xml(result: DiffResult) -> str:
    """The layers as ``<testcase>``s of one ``<testsuite>``."""
    layers = result.layer_rows
    failures = sum(not r.passed for r in layers)
    words = layer_statuses(result)
    skipped = sum(word == WORD_NA for word in words)
    suites = ET.Element("testsuites", name="introspect diff", tests=str(len(layers)),
                        failures=str(failures), errors="0")
    suite = ET.SubElement(suites, "testsuite",
                          name=f"{result.candidate_label} vs {result.reference_label}",
                          tests=str(len(layers)), failures=str(failures), errors="0",
                          skipped=str(skipped))
    for r, word in zip(layers, words, strict=True):
        case = ET.SubElement(suite, "testcase", classname="introspect.diff", name=r.layer)
        if word == WORD_NA:  # nothing compared: neither a pass nor a failure
            ET.SubElement(case, "skipped", message=f"nothing compared in {r.layer}")
        elif not r.passed:
            rows = [n for n in result.rows if n.layer == r.layer and n.status == STATUS_FAIL]
            first = rows[0] if rows else None
            message = (f"{r.failing} node(s) over budget; first {first.reference_node} "
                       f"({first.op}), local max abs error {first.local_max_abs_err:.3g}"
                       if first else f"{r.failing} node(s) over budget")
            failure = ET.SubElement(case, "failure", message=message, type="parity")
            failure.text = "\n".join(
                f"{n.reference_node} -> {n.candidate_node} ({n.op} {n.shape}): local max abs "
                f"error {n.local_max_abs_err:.3g}, budget atol {n.atol:.3g} rtol {n.rtol:.3g}"
                for n in rows)
    d = result.first_divergence
    if d is not None:
        out = ET.SubElement(suite, "system-out")
        out.text = "\n".join([f"first divergence: {d.reference_node} ({d.op} in "
                              f"{d.module or d.layer})", *(f"hint: {h}" for h in d.hints)])
    ET.indent(suites)
    body = ET.tostring(suites, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'
