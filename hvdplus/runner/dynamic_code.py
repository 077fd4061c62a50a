"""The files and lines of `hvdplus.run`'s function, in what its ranks report.

cloudpickle sends a function of `__main__`, of a notebook cell or a closure by value, and names
its code "<dynamic-code>" wherever it was defined (so that the same function always pickles
alike): a rank's traceback then names no file and shows no line of the source, which the rank
does not have. The caller has both; `restore_sources` puts them back into a rank's report,
matching frames by the name of their function.
"""

import dataclasses
import linecache
import re
import types
from typing import Callable, Dict, Set

from ..common.rank_errors import RankFailure

__all__ = ["DYNAMIC_FILE", "source_files", "restore_sources"]

DYNAMIC_FILE = "<dynamic-code>"
_DYNAMIC_FRAME = re.compile(r'^(\s*)File "<dynamic-code>", line (\d+), in (.+)$')


def source_files(fn: Callable) -> Dict[str, str]:
    """The file of each function of `fn`'s code by its name: `fn`, the functions defined in it,
    and the functions of its module that it calls, theirs in turn; a name found in two files
    is left out."""
    files: Dict[str, Set[str]] = {}
    module = getattr(fn, "__module__", None)
    seen = set()
    pending = [getattr(fn, "__code__", None)]
    while pending:
        code = pending.pop()
        if code is None or code in seen:
            continue
        seen.add(code)
        files.setdefault(code.co_name, set()).add(code.co_filename)
        pending += [const for const in code.co_consts if isinstance(const, types.CodeType)]
        for name in code.co_names:
            called = getattr(fn, "__globals__", {}).get(name)
            if isinstance(called, types.FunctionType) and called.__module__ == module:
                pending.append(called.__code__)
    return {name: next(iter(paths)) for name, paths in files.items() if len(paths) == 1}


def _restored_traceback(text: str, files: Dict[str, str]) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        frame = _DYNAMIC_FRAME.match(line.rstrip("\n"))
        file = frame and files.get(frame.group(3))
        if not file:
            lines.append(line)
            continue
        indent, number, name = frame.groups()
        lines.append(f'{indent}File "{file}", line {number}, in {name}\n')
        source = linecache.getline(file, int(number)).strip()
        if source:
            lines.append(f"{indent}  {source}\n")
    return "".join(lines)


def _function_at(text: str, line: int) -> str:
    """The name of the function of the innermost dynamic frame at `line` in the traceback `text`."""
    names = [frame.group(3) for frame in map(_DYNAMIC_FRAME.match, text.splitlines())
             if frame and int(frame.group(2)) == line]
    return names[-1] if names else ""


def restore_sources(failure: RankFailure, files: Dict[str, str]) -> RankFailure:
    """`failure` with the files of `files` (source_files) in place of "<dynamic-code>", in its
    traceback (with the lines of the source) and where it was raised."""
    if DYNAMIC_FILE not in failure.traceback and failure.file != DYNAMIC_FILE:
        return failure
    file = failure.file
    if file == DYNAMIC_FILE:
        file = files.get(_function_at(failure.traceback, failure.line), file)
    return dataclasses.replace(failure, file=file, traceback=_restored_traceback(failure.traceback, files))
