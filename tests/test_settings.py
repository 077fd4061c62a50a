"""Environment variables into Settings, including Horovod's spellings."""

import pytest

from hvdplus.common.settings import Settings, overlaps_compute


def test_defaults():
    settings = Settings.from_env({})
    assert settings.fusion_threshold_bytes == 64 * 1024 * 1024
    assert settings.allreduce_algorithm == "auto"
    assert settings.stall_check_seconds == 60.0 and settings.stall_shutdown_seconds == 0.0


def test_ours_win_over_horovods():
    settings = Settings.from_env({"HOROVOD_FUSION_THRESHOLD": "100", "HVDPLUS_FUSION_THRESHOLD": "200",
                                  "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_TIMELINE": "/tmp/t.json"})
    assert settings.fusion_threshold_bytes == 200
    assert settings.cycle_time_ms == 2.5
    assert settings.timeline_path == "/tmp/t.json"


def test_horovods_stall_and_timeline_variables():
    settings = Settings.from_env({"HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
                                  "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert (settings.stall_check_seconds, settings.stall_shutdown_seconds) == (5.0, 30.0)
    assert settings.timeline_mark_cycles is True and Settings.from_env({}).timeline_mark_cycles is False
    disabled = Settings.from_env({"HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5"})
    assert disabled.stall_check_seconds == 0.0
    assert Settings.from_env({"HOROVOD_STALL_CHECK_DISABLE": "0"}).stall_check_seconds == 60.0


def test_the_stall_times_have_short_names_too():
    settings = Settings.from_env({"HVDPLUS_STALL_CHECK_TIME": "2", "HVDPLUS_STALL_SHUTDOWN_TIME": "7"})
    assert (settings.stall_check_seconds, settings.stall_shutdown_seconds) == (2.0, 7.0)
    # The long names (Horovod's spelling after the prefix) win where both are set.
    both = {"HVDPLUS_STALL_CHECK_TIME": "2", "HVDPLUS_STALL_CHECK_TIME_SECONDS": "3"}
    assert Settings.from_env(both).stall_check_seconds == 3.0


def test_hierarchical_flag_selects_the_algorithm():
    assert Settings.from_env({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}).allreduce_algorithm == "hierarchical"
    assert Settings.from_env({"HVDPLUS_HIERARCHICAL_ALLREDUCE": "0"}).allreduce_algorithm == "auto"


@pytest.mark.parametrize("environ, message", [
    ({"HVDPLUS_ALLREDUCE_ALGO": "fastest"}, "expected one of auto, mpi, ring"),
    ({"HVDPLUS_FUSION_THRESHOLD": "lots"}, "not a valid int"),
    ({"HVDPLUS_RANKS_PER_NODE": "-2"}, "must be positive"),
    ({"HVDPLUS_OVERLAP": "sometimes"}, "expected one of auto, on, off"),
])
def test_bad_values_are_named(environ, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_env(environ)


@pytest.mark.parametrize("raw, mode", [(None, "auto"), ("1", "on"), ("ON", "on"), ("false", "off")])
def test_overlap_spellings(raw, mode):
    environ = {} if raw is None else {"HOROVOD_OVERLAP": raw}
    assert Settings.from_env(environ).overlap == mode


@pytest.mark.parametrize("mode, ranks, cores, expected", [
    ("auto", 2, 2, False),  # every core trains: hold collectives for the waiters
    ("auto", 2, 4, True),   # a core to spare for each engine thread
    ("auto", 8, 16, True),
    ("on", 2, 2, True),
    ("off", 1, 64, False),
])
def test_overlap_needs_a_spare_core_per_rank(mode, ranks, cores, expected):
    assert overlaps_compute(mode, ranks, cores) is expected


def test_the_configuration_page_lists_every_setting_as_declared():
    from testkit import settings_tables

    with open(settings_tables.PAGE) as file:
        page = file.read()
    assert settings_tables.rewritten(page) == page, "run python tests/testkit/settings_tables.py"
    assert all(f"`{setting.names[0]}`" in page for setting in settings_tables.SETTINGS)
