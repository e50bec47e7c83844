"""The notebooks' pictures: :mod:`workbook.plots.common` (what every topic draws: coverage maps,
byte sizes, source listings) and one module per topic
(``workbook.plots.<topic>``) with that topic's pictures and displays."""
from .common import COVERAGE_COLORS, coverage_map, human_bytes, show_code, source_of  # noqa: F401
