"""Statistics over realizations: moments, significant digits, decisions, segmentations,
layers and training series; terminal, JSON and HTML reports.

```python
from numvar.analysis import analyze, significant_digits, render_html
res = analyze(samples)                  # JSON-able dict (keys: see numvar.analysis.core)
render_html(res, samples, "report.html")
```
"""

from .classification import classify
from .core import SCHEMA, analyze, compare, median_output_digits
from .digits import SigDigits, minimum_trials, significant_digits, summarize_digits
from .html import render_compare_html, render_html
from .segmentation import disagreement_map, label_maps, segment


def analyze_run(path, **kw) -> dict:
    """:func:`analyze` the run directory at ``path`` (records the path in the result)."""
    from ..runner.store import load_run

    return analyze(load_run(path), path=str(path), **kw)


__all__ = ["analyze", "analyze_run", "compare", "significant_digits", "render_html", "render_compare_html",
           "median_output_digits", "minimum_trials", "summarize_digits", "SigDigits",
           "classify", "segment", "label_maps", "disagreement_map", "SCHEMA"]
