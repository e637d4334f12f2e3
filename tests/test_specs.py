"""The one parser of the CLI's ``NAME=KIND:ARGS`` specs (phalanx.config.specs): what it reads, what every
bad spec's error says, and that `--search` (tuning) and `--mutate` (population) both read through it."""

from __future__ import annotations

import dataclasses

import pytest

from phalanx.cli import main
from phalanx.config.specs import parse_kind_args, split_name
from phalanx.errors import ConfigError
from phalanx.population.evolution import MUTATION_KINDS, Mutation
from phalanx.tuning import KINDS, Dimension

EXAMPLE = "learning_rate=log:1e-5,1e-3"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("learning_rate=log:1e-5,1e-3", ("learning_rate", "log:1e-5,1e-3")),
        (" gamma =uniform:0.9,0.99", ("gamma", "uniform:0.9,0.99")),
        ("activation=choice:a=b,c", ("activation", "choice:a=b,c")),  # the first '=' ends the name
        ("gamma=", ("gamma", "")),
    ],
)
def test_split_name_takes_the_name_before_the_first_equals(spec, expected):
    assert split_name(spec, "--search", EXAMPLE) == expected


@pytest.mark.parametrize(
    ("spec", "what"), [("gamma", "no '=' between the name and the kind"), ("=log:1,2", "no name before")]
)
def test_split_name_errors_show_the_spec_what_is_wrong_and_an_example(spec, what):
    with pytest.raises(ConfigError) as error:
        split_name(spec, "--search", EXAMPLE)
    message = str(error.value)
    assert message.startswith(f"--search {spec!r}: expected NAME=KIND:ARGS (")
    assert what in message and message.endswith(f"e.g. {EXAMPLE}")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("log:1e-5,1e-3", ("log", (1e-5, 1e-3))),  # YAML 1.2 floats: 1e-5 is a number
        ("log:1.0e-05, 0.001", ("log", (1e-5, 1e-3))),  # as Dimension.text writes it
        ("int:1,10,2", ("int", (1, 10, 2))),
        ("int: 1_000 , 2e3 ", ("int", (1000, 2000.0))),
        ("choice:tanh,relu", ("choice", ("tanh", "relu"))),
        ("choice:[64,64],[256,256]", ("choice", ([64, 64], [256, 256]))),
        ("choice:'a,b',c", ("choice", ("a,b", "c"))),
        ("choice:null,true,0", ("choice", (None, True, 0))),
        ("uniform:0.9,0.99,", ("uniform", (0.9, 0.99))),  # a trailing comma, as in YAML
        (" log :", ("log", ())),
    ],
)
def test_parse_kind_args_reads_the_values_as_yaml(spec, expected):
    kind, arguments = parse_kind_args(spec, KINDS, "--search x=...")
    assert (kind, arguments) == expected
    assert [type(value) for value in arguments] == [type(value) for value in expected[1]]


def test_an_unknown_kind_names_the_closest_one_and_lists_every_kind():
    with pytest.raises(ConfigError) as error:
        parse_kind_args("logg:1e-5,1e-3", KINDS, "--search lr=logg:1e-5,1e-3")
    message = str(error.value)
    assert message.startswith("--search lr=logg:1e-5,1e-3: unknown kind 'logg'. Did you mean 'log'?")
    assert all(written in message for written in KINDS.values())


def test_a_kind_without_its_colon_says_so():
    with pytest.raises(ConfigError, match=r"--mutate lr=perturb: no ':' after the kind 'perturb'\. Write"):
        parse_kind_args("perturb", MUTATION_KINDS, "--mutate lr=perturb")


def test_values_yaml_cannot_read_say_what_the_kind_expects():
    with pytest.raises(ConfigError) as error:
        parse_kind_args("uniform:0.8,,1.2", KINDS, "--search gamma=uniform:0.8,,1.2")
    message = str(error.value)
    assert message.startswith("--search gamma=uniform:0.8,,1.2: cannot read the values '0.8,,1.2' (")
    assert message.endswith(f"expected {KINDS['uniform']}.")


def test_search_and_mutate_read_the_documented_specs_through_the_one_parser():
    assert Dimension.parse("learning_rate", "log:1e-4,3e-3") == Dimension("log", (1e-4, 3e-3))
    assert Dimension.parse("hidden_sizes", "choice:[64,64],[256,256]").arguments == ([64, 64], [256, 256])
    assert Mutation.spec_from_text("log_uniform:1e-4,1e-2") == {"log_uniform": [1e-4, 1e-2]}
    assert Mutation.spec_from_text("choices:0,0.01,0.02") == {"choices": [0, 0.01, 0.02]}
    assert Mutation.spec_from_text("min:1e-5") == {"min": 1e-5}  # one value of a bound is the value
    assert Mutation.spec_from_text("perturb:0.8,1.25") == {"perturb": [0.8, 1.25]}
    assert Mutation.spec_from_text("choices:[64,64],[128,128]") == {"choices": [[64, 64], [128, 128]]}
    with pytest.raises(ConfigError, match="--search gamma=uniformm:0.9,1: unknown kind 'uniformm'"):
        Dimension.parse("gamma", "uniformm:0.9,1")
    with pytest.raises(ConfigError, match="--mutate: unknown kind 'perturbb'. Did you mean 'perturb'"):
        Mutation.spec_from_text("perturbb:0.8,1.2")


def test_every_mutation_kind_is_a_key_of_a_mutation():
    assert list(MUTATION_KINDS) == [field.name for field in dataclasses.fields(Mutation)]


def test_the_cli_reports_a_bad_mutate_spec(capsys):
    base = ["population", "run", "ppo", "CartPole-v1", "--size", "2"]
    assert main([*base, "--mutate", "=perturb:0.8,1.2"]) == 2
    assert "--mutate '=perturb:0.8,1.2': expected NAME=KIND:ARGS (no name before" in capsys.readouterr().err
    assert main([*base, "--mutate", "learning_rate=perturbb:0.8,1.2"]) == 2
    err = capsys.readouterr().err
    assert "--mutate learning_rate=perturbb:0.8,1.2: unknown kind 'perturbb'" in err
