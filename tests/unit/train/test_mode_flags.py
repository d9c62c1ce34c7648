"""Settings of one --mode given to a run of another are refused, naming the flag, not ignored: ``--mode async
--sync-timeout 5`` trained without a word about the timeout it never used (psflow.train.config.train_config).

Which mode reads which setting: ``--replicas-to-aggregate`` and ``--averaging`` sync only (ssp applies each push on
arrival, as async does); ``--sync-timeout`` and ``--on-timeout`` sync and ssp (psflow.ps.staleness); ``--staleness``
ssp only. The CLI refuses a flag given at all, even at its default value (it cannot tell otherwise); the config a
setting other than its default.
"""

from __future__ import annotations

import pytest

from psflow.cli.main import build_parser
from psflow.cli.training import train_config
from psflow.train.config import ConfigError, SyncSettings, TrainConfig

pytestmark = pytest.mark.timeout(30)


def _cli(*flags: str) -> TrainConfig:
    args = build_parser().parse_args(["train", "--train", "x", *flags])
    return train_config(args, num_ps=None, num_workers=None)


@pytest.mark.parametrize(("settings", "line"), [
    ({"sync_timeout": 5}, "--sync-timeout 5 is for --mode sync or ssp (this run: --mode async, which applies each "
                          "push on arrival and waits for no worker)"),
    ({"on_timeout": "proceed"}, "--on-timeout proceed is for --mode sync or ssp (this run: --mode async, which "
                                "applies each push on arrival and waits for no worker)"),
    ({"replicas_to_aggregate": 2}, "--replicas-to-aggregate 2 is for --mode sync (this run: --mode async, which "
                                   "applies each push on arrival and waits for no worker)"),
    ({"averaging": "per_row"}, "--averaging per_row is for --mode sync (this run: --mode async, which applies each "
                               "push on arrival and waits for no worker)"),
    ({"staleness": 4}, "--staleness 4 is for --mode ssp (this run: --mode async, which applies each push on "
                       "arrival and waits for no worker)"),
    ({"mode": "ssp", "averaging": "sparse_sum"}, "--averaging sparse_sum is for --mode sync (this run: --mode ssp, "
                                                  "which applies each push on arrival, alone)"),
    ({"mode": "ssp", "replicas_to_aggregate": 1}, "--replicas-to-aggregate 1 is for --mode sync (this run: --mode "
                                                  "ssp, which applies each push on arrival, alone)"),
    ({"mode": "sync", "staleness": 0}, "--staleness 0 is for --mode ssp (this run: --mode sync, which steps every "
                                       "worker together)"),
])
def test_a_setting_of_another_mode_is_refused_naming_its_flag(settings: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError) as e:
        TrainConfig.flat(num_workers=2, **settings)
    assert str(e.value) == line


def test_the_settings_each_mode_reads_are_taken() -> None:
    TrainConfig.flat(mode="ssp", num_workers=2, staleness=0, sync_timeout=5, on_timeout="proceed")
    TrainConfig.flat(mode="sync", num_workers=2, replicas_to_aggregate=1, averaging="per_row", sync_timeout=5,
                     on_timeout="proceed")
    TrainConfig.flat(num_workers=2)  # every default, async


@pytest.mark.parametrize(("flags", "line"), [
    # given at its default value: the user still believes they set something
    (["--sync-timeout", "30"], "--sync-timeout 30 is for --mode sync or ssp (this run: --mode async, which applies "
                               "each push on arrival and waits for no worker)"),
    (["--averaging", "replicas"], "--averaging replicas is for --mode sync (this run: --mode async, which applies "
                                  "each push on arrival and waits for no worker)"),
    (["--staleness", "2", "--mode", "sync"], "--staleness 2 is for --mode ssp (this run: --mode sync, which steps "
                                             "every worker together)"),
    (["--on-timeout", "fail", "--mode", "async"], "--on-timeout fail is for --mode sync or ssp (this run: --mode "
                                                  "async, which applies each push on arrival and waits for no worker)"),
])
def test_the_cli_refuses_a_flag_of_another_mode_even_at_its_default(flags: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as e:
        _cli(*flags)
    assert str(e.value) == line


def test_the_cli_takes_each_modes_own_flags_and_fills_the_defaults() -> None:
    sync = _cli("--mode", "sync", "--averaging", "per_row", "--replicas-to-aggregate", "1", "--sync-timeout", "5")
    assert (sync.sync.averaging, sync.sync.replicas_to_aggregate, sync.sync.timeout) == ("per_row", 1, 5.0)
    ssp = _cli("--mode", "ssp", "--staleness", "0", "--on-timeout", "proceed")
    assert (ssp.sync.staleness, ssp.sync.on_timeout, ssp.sync.timeout) == (0, "proceed", SyncSettings().timeout)
    assert _cli().sync == SyncSettings()


@pytest.mark.parametrize(("settings", "line"), [
    ({"replicas_to_aggregate": 3}, "--replicas-to-aggregate 3 exceeds --workers (2): a sync step aggregates at "
                                   "most one gradient per worker"),
    ({"replicas_to_aggregate": 0}, "--replicas-to-aggregate must be >= 1, got 0"),
    ({"sync_timeout": 0}, "--sync-timeout must be > 0 seconds, got 0"),
    ({"staleness": -1, "mode": "ssp"}, "--staleness must be >= 0, got -1"),
])
def test_a_sync_setting_out_of_range_names_its_flag(settings: dict[str, object], line: str) -> None:
    """``--replicas-to-aggregate 3`` with 2 workers said 'replicas_to_aggregate must be in 1..total_num_replicas
    (2), got 3', the ps module's names, not the flag's."""
    with pytest.raises(ConfigError) as e:
        TrainConfig.flat(**{"mode": "sync", "num_workers": 2, **settings})
    assert str(e.value) == line
