"""Rows of measurements (lists of dicts) rendered as Markdown tables for the pages."""


def markdown_table(rows, columns: dict) -> str:
    """Rows of a sweep as a Markdown table.

    Args:
      rows: dicts, e.g. from a sweep above.
      columns: {row key: header}; floats are shown with 3 significant digits, None as "—".
    """

    def cell(value):
        if value is None or value == "":
            return "—"
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value).replace("|", "\\|").replace("$", "\\$")

    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(key)) for key in columns) + " |" for row in rows]
    return "\n".join(lines)
