"""The tables of docs/configuration.md that list hvdplus's settings, written from their one
declaration (hvdplus.common.settings.SETTINGS). tests/test_settings.py checks that the page
holds them; after a change to the declarations, rewrite the page with

    python tests/testkit/settings_tables.py
"""

import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "configuration.md")
sys.path.insert(0, REPO)

from hvdplus.common.settings import SETTINGS  # noqa: E402 (after the repository is on the path)

# Each section's table follows this marker on the page.
MARKER = "<!-- the {} settings: tests/testkit/settings_tables.py writes this table -->"
_WITH_FLAGS = {"engine", "elastic"}


def table(section: str) -> str:
    with_flags = section in _WITH_FLAGS
    lines = ["| variable | launcher flag | default | meaning |" if with_flags else "| variable | default | meaning |",
             "| --- | --- | --- | --- |" if with_flags else "| --- | --- | --- |"]
    for setting in SETTINGS:
        if setting.section != section:
            continue
        cells = [f"`{setting.names[0]}`" + (f" (or `HVDPLUS_{setting.short}`)" if setting.short else "")]
        if with_flags:
            cells.append(_flag(setting))
        cells += [setting.shown_default or str(setting.default), setting.meaning]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _flag(setting) -> str:
    if setting.flag is None:
        return ""
    shown = setting.flag.shown or setting.flag.spelling
    return shown if shown.startswith(("`", "(", "any ")) else f"`{shown}`"


def sections():
    return sorted({setting.section for setting in SETTINGS})


def rewritten(page: str) -> str:
    """`page` with each marked table replaced by the one the declarations give."""
    for section in sections():
        marker = MARKER.format(section)
        pattern = re.escape(marker) + r"\n\n(\|.*\n)+"
        if not re.search(pattern, page):
            raise ValueError(f"{PAGE} has no table after {marker!r}")
        page = re.sub(pattern, lambda _: f"{marker}\n\n{table(section)}", page)
    return page


if __name__ == "__main__":
    with open(PAGE) as file:
        text = file.read()
    with open(PAGE, "w") as file:
        file.write(rewritten(text))
