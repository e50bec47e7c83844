"""Exercise graders and their reference solutions, one module per notebook (``workbook.graders.<topic>``,
with the topic's stem). A grader raises ``AssertionError`` with a message that teaches; notebooks call
it through :func:`workbook.check.grade`, which turns any error into a message and never stops the
notebook. Each grader is tested (in the topic's test file) against its solution, its stub and
plausible wrong answers."""
