"""config.load_config: [tool.gpudoctor] in the nearest pyproject.toml, CLI flags on top."""

from __future__ import annotations

import pytest

from gpudoctor.config import Config, Thresholds, load_config
from gpudoctor.errors import ConfigError


def _project(tmp_path, text: str):
    (tmp_path / "pyproject.toml").write_text(text)
    sub = tmp_path / "src" / "train"
    sub.mkdir(parents=True)
    return sub


def test_defaults_without_pyproject(tmp_path):
    cfg = load_config(tmp_path)
    assert cfg.thresholds == Thresholds() and cfg.select == () and cfg.ignore == ()


def test_nearest_pyproject_table(tmp_path):
    where = _project(tmp_path, """
[tool.gpudoctor]
select = ["GD1", "gd201"]
ignore = ["GD104"]
[tool.gpudoctor.thresholds]
dataloader_wait_share_pct = 10
pageable_h2d_max_bytes = 131072
unquantified_severity = "INFO"
""")
    cfg = load_config(where)
    assert cfg.select == ("GD1", "GD201") and cfg.ignore == ("GD104",)
    assert cfg.thresholds.dataloader_wait_share_pct == 10.0
    assert cfg.thresholds.pageable_h2d_max_bytes == 131072
    assert cfg.thresholds.unquantified_severity == "info"
    assert cfg.source.endswith("pyproject.toml")
    assert cfg.rule_enabled("GD101") and cfg.rule_enabled("GD201")
    assert not cfg.rule_enabled("GD104") and not cfg.rule_enabled("GD301")


def test_pyproject_without_table_gives_defaults(tmp_path):
    where = _project(tmp_path, "[project]\nname = 'x'\n")
    assert load_config(where) == Config()


def test_cli_flags_on_top(tmp_path):
    where = _project(tmp_path, "[tool.gpudoctor]\nselect = ['GD1']\n[tool.gpudoctor.thresholds]\ngpu_idle_share_pct = 30\n")
    cfg = load_config(where, select=("GD2",), ignore=("GD202",), overrides=("gpu_idle_share_pct=40", "error_share_pct=25"))
    assert cfg.select == ("GD2",) and cfg.ignore == ("GD202",)
    assert cfg.thresholds.gpu_idle_share_pct == 40.0 and cfg.thresholds.error_share_pct == 25.0


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ("[tool.gpudoctor]\nselct = ['GD1']\n", "unknown key 'selct'"),
        ("[tool.gpudoctor]\nselect = ['pin-memory']\n", "not a rule code"),
        ("[tool.gpudoctor]\nselect = 3\n", "expected a list of rule codes"),
        ("[tool.gpudoctor.thresholds]\ngpu_idle_pct = 10\n", "unknown threshold 'gpu_idle_pct'"),
        ("[tool.gpudoctor.thresholds]\ngpu_idle_share_pct = 'lots'\n", "must be a number"),
        ("[tool.gpudoctor.thresholds]\ngpu_idle_share_pct = -1\n", "non-negative"),
        ("[tool.gpudoctor.thresholds]\npageable_h2d_max_bytes = 1.5\n", "whole number"),
        ("[tool.gpudoctor.thresholds]\nwarning_share_pct = 50\n", "must not exceed error_share_pct"),
        ("[tool.gpudoctor.thresholds]\nunquantified_severity = 'fatal'\n", "one of error, warning, info"),
        ("[tool.gpudoctor\n", "not valid TOML"),
    ],
)
def test_bad_tables_raise_one_line_config_errors(tmp_path, toml, match):
    where = _project(tmp_path, toml)
    with pytest.raises(ConfigError, match=match) as err:
        load_config(where)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (("gpu_idle_share_pct",), "expected FIELD=VALUE"),
        (("nope=3",), "unknown threshold 'nope'"),
        (("gpu_idle_share_pct=abc",), "must be a number"),
    ],
)
def test_bad_set_flags(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path, overrides=overrides)


def test_bad_select_flag(tmp_path):
    with pytest.raises(ConfigError, match="--select"):
        load_config(tmp_path, select=("DL201",))
