"""Exercise graders and their reference solutions, one module per notebook (``workbook.graders.<topic>``,
with the topic's stem), and :mod:`.common`, what they share (the one answer to a zero fill where the
statement says ``torch.empty``; allocations with a poisoned guard zone, so that a store past the end
of a too-small buffer is named instead of crashing Triton's interpreter). A grader raises
``AssertionError`` with a message that teaches; notebooks call it through :func:`workbook.check.grade`,
which turns any error into a message and never stops the notebook. Each grader is tested (in the
topic's test file) against its solution, its stub and a table of plausible wrong answers."""
