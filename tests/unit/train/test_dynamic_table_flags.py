"""A dynamic table's options given both by their flags (--embedding-table dynamic, --capacity, ...) and in
``--model-param dynamic_table={...}`` (the only way to set those without a flag: sketch_width, seed, ...) are
merged, not dropped: the flags' options replaced the --model-param's whole, silently (psflow.cli.training)."""

from __future__ import annotations

import pytest
from test_mode_flags import _cli

from psflow.models.api import DYNAMIC_TABLE_PARAM
from psflow.train.config import ConfigError

pytestmark = pytest.mark.timeout(30)


def _options(*flags: str) -> object:
    """The dynamic table options of ``psflow train --train x`` with ``flags``."""
    return _cli(*flags).model.params.get(DYNAMIC_TABLE_PARAM)


def test_the_flags_and_the_model_param_options_are_merged() -> None:
    options = _options("--embedding-table", "dynamic", "--capacity", "100",
                       "--model-param", 'dynamic_table={"sketch_width": 64}')
    assert options == {"capacity_rows": 100, "sketch_width": 64}
    # --model-param dynamic_table makes the table dynamic: its flags are taken, not refused
    assert _options("--model-param", 'dynamic_table={"sketch_width": 64}', "--capacity", "5") == \
        {"capacity_rows": 5, "sketch_width": 64}
    assert _options("--model-param", 'dynamic_table={"sketch_width": 64}') == {"sketch_width": 64}
    assert _options("--embedding-table", "dynamic", "--admit-after", "2") == {"admit_after": 2}


def test_an_option_given_both_ways_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError) as e:
        _options("--embedding-table", "dynamic", "--capacity", "100",
                 "--model-param", 'dynamic_table={"capacity_rows": 200}')
    assert str(e.value) == "--capacity 100 and --model-param dynamic_table's capacity_rows 200: give it once"


def test_of_two_options_given_both_ways_the_first_flag_is_named_on_every_run() -> None:
    """Both ways twice: the refusal names the first in the flags' order (--capacity before --admit-after). It named
    one of a set's, whichever the process's string hashing put first, so the line changed from run to run."""
    with pytest.raises(ConfigError) as e:
        _options("--embedding-table", "dynamic", "--capacity", "100", "--admit-after", "2",
                 "--model-param", 'dynamic_table={"admit_after": 3, "capacity_rows": 200}')
    assert str(e.value) == "--capacity 100 and --model-param dynamic_table's capacity_rows 200: give it once"


def test_flags_of_a_static_table_are_still_refused() -> None:
    with pytest.raises(ConfigError, match=r"^--capacity 5: these options are for dynamic tables; add "
                                          r"--embedding-table dynamic$"):
        _options("--capacity", "5")


@pytest.mark.parametrize(("flags", "line"), [
    # an option --model-param gave is named as given there, not by a flag the user never typed (--capacity), and
    # a table made dynamic by --model-param alone is not said to be --embedding-table dynamic's
    (["--model-param", 'dynamic_table={"capacity_rows": 0}', "--admit-after", "2"],
     "--model-param dynamic_table: capacity_rows must be an int >= 1, got 0"),
    (["--embedding-table", "dynamic", "--model-param", 'dynamic_table={"capacity_rows": -5}'],
     "--embedding-table dynamic: --model-param dynamic_table's capacity_rows must be an int >= 1, got -5"),
    # an option given by its flag is still named by it
    (["--embedding-table", "dynamic", "--capacity", "0", "--model-param", 'dynamic_table={"sketch_width": 64}'],
     "--embedding-table dynamic: --capacity must be an int >= 1, got 0"),
])
def test_a_bad_option_is_named_where_it_was_given(flags: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as e:
        _options(*flags)
    assert str(e.value) == line


def test_a_misspelt_model_param_option_lists_the_names_model_param_takes() -> None:
    """--model-param dynamic_table={"sketch_widht": ...} listed the known options as flags (--capacity, ...), which
    --model-param does not take."""
    with pytest.raises(ConfigError) as e:
        _options("--embedding-table", "dynamic", "--model-param", 'dynamic_table={"sketch_widht": 64}')
    assert "unknown options ['sketch_widht']" in str(e.value) and "capacity_rows" in str(e.value)
    assert "--capacity" not in str(e.value)


def test_a_static_table_typed_with_dynamic_options_is_refused() -> None:
    """--embedding-table static --model-param dynamic_table={...} trained dynamic tables without a word: the
    --model-param options make them dynamic, and static was the flag's default, so psflow could not tell it typed."""
    with pytest.raises(ConfigError) as e:
        _options("--embedding-table", "static", "--model-param", 'dynamic_table={"sketch_width": 64}')
    assert str(e.value) == ("--embedding-table static and --model-param dynamic_table (which makes the tables "
                            "dynamic): give one")
    assert _options("--embedding-table", "static") is None


def test_the_model_param_options_alone_are_checked_as_with_a_flag() -> None:
    """--model-param dynamic_table={"capacity_rows": 0} alone was not checked by train_config (so psflow k8s render
    wrote manifests whose every pod then failed), while with any dynamic table flag beside it it was refused."""
    with pytest.raises(ConfigError) as e:
        _options("--model-param", 'dynamic_table={"capacity_rows": 0}')
    assert str(e.value) == "--model-param dynamic_table: capacity_rows must be an int >= 1, got 0"
