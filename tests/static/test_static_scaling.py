"""`check` stays linear in a file's size on files of many training loops (issue 38: "check is linear").

Counted, not timed: the work per DataLoader and per quote must not grow with the number of loops in the
file. GD302 looked through every DataLoader of the program for every copy, `dataset_changed` (GD201,
GD202) through every loop for every DataLoader, and each finding split the whole file to find its quote:
a 560 KB file of 2,175 small training loops took 95 s for `--diff` (8,700 fixes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.config import Config
from gpudoctor.static import check_paths, snippets
from gpudoctor.static import context as static_context

LOOP = '''
def train_{i}(ds, model, opt):
    loader = DataLoader(ds, batch_size=32, pin_memory=True)
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(loss.item())
'''


def _calls(tmp_path: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    path = tmp_path / f"loops_{n}.py"
    path.write_text("import torch\nfrom torch.utils.data import DataLoader\n\n" + "\n".join(LOOP.format(i=i) for i in range(n)))
    counts = {"names": 0, "splits": 0}
    names = static_context.ProjectContext.loader_names
    stripped = snippets._stripped_lines.__wrapped__

    def counted_names(self, fn, lf):  # noqa: ANN001, ANN202
        counts["names"] += 1
        return names(self, fn, lf)

    def counted_split(text):  # noqa: ANN001, ANN202
        counts["splits"] += 1
        return stripped(text)

    monkeypatch.setattr(static_context.ProjectContext, "loader_names", counted_names)
    monkeypatch.setattr(snippets, "_stripped_lines", snippets.functools.lru_cache(maxsize=4)(counted_split))
    report = check_paths([path], Config())
    return counts["names"], counts["splits"], len(report.findings)


def test_the_work_per_training_loop_does_not_grow_with_the_file(tmp_path, monkeypatch):
    names_40, splits_40, found_40 = _calls(tmp_path, 40, monkeypatch)
    names_160, splits_160, found_160 = _calls(tmp_path, 160, monkeypatch)
    assert found_160 > 3.9 * found_40 > 0  # the same findings in every loop (and one of the program)
    assert names_160 <= 4 * names_40 * 1.1, (names_40, names_160)  # was 16x: every DataLoader for every loop
    assert splits_40 <= 1 and splits_160 <= 1  # the file split once for its quotes, not once per finding
