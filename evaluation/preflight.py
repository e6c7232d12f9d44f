"""Every ``--simulator`` spec checked before an evaluation writes anything: a spec that cannot work
stops the run at once, each problem on one line naming its spec, instead of ending in a report of
zeros after every request has failed.

What is checked: that the spec names a simulator and its argument parses; for ``openai:MODEL@URL``,
that the endpoint answers one request (:meth:`OpenAISimulatorSettings.probe`); for
``checkpoint:PATH``, that PATH is a model folder with a config, weights and tokenizer files (loading
it would take longer than the check is worth). A caller with simulators of its own (the flows,
with the synthetic world's shoppers) passes them and their checks in, over these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from evaluation.simulators import LAKE_SIMULATORS, SAMPLED_SIMULATORS, SIMULATORS, LakeBuilder, Sampling

#: spec name -> check taking the text after "name:", the lake and the sampling: what is wrong, or None
SpecCheck = Callable[[str, Path, Sampling], str | None]

CONFIG_FILE = "config.json"
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


class SimulatorSpecError(ValueError):
    """One or more ``--simulator`` specs cannot be evaluated; the message has a line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def model_folder_problem(folder: Path) -> str | None:
    """What a model folder lacks of config, weights and tokenizer files; None when it has all three."""
    if not folder.exists():
        return f"{folder} does not exist (a local model folder is expected)"
    if not folder.is_dir():
        return f"{folder} is a file, not a model folder"
    missing = []
    if not (folder / CONFIG_FILE).is_file():
        missing.append(CONFIG_FILE)
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        missing.append("weights (*.safetensors or pytorch_model*.bin)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer files ({' or '.join(TOKENIZER_FILES)})")
    return f"{folder} lacks {', '.join(missing)}" if missing else None


def checkpoint_problem(argument: str, lake: Path, sampling: Sampling) -> str | None:
    if not argument:
        return "checkpoint:PATH needs the path of a model folder"
    return model_folder_problem(Path(argument).expanduser())


def openai_problem(argument: str, lake: Path, sampling: Sampling) -> str | None:
    from evaluation.openai_simulator import OpenAISimulatorSettings

    try:
        settings = OpenAISimulatorSettings.from_spec(argument, sampling)
    except ValueError as error:
        return str(error).splitlines()[0]
    return settings.probe()


def random_problem(argument: str, lake: Path, sampling: Sampling) -> str | None:
    if argument and not argument.isdigit():
        return f"random:SEED takes a whole-number seed, not {argument!r}"
    return None


SPEC_CHECKS: dict[str, SpecCheck] = {
    "checkpoint": checkpoint_problem,
    "openai": openai_problem,
    "random": random_problem,
}


def spec_problem(
    spec: str,
    lake: str | Path,
    sampling: Sampling,
    lake_builders: Mapping[str, LakeBuilder] | None = None,
    checks: Mapping[str, SpecCheck] | None = None,
) -> str | None:
    """What is wrong with one spec for an evaluation of ``lake``, or None; ``lake_builders`` and
    ``checks``: the caller's own simulators built from a lake and checks (over SPEC_CHECKS)."""
    name, _, argument = spec.partition(":")
    builders = {**LAKE_SIMULATORS, **(lake_builders or {})}
    every_check = {**SPEC_CHECKS, **(checks or {})}
    if spec in builders:
        check = every_check.get(spec)
    elif name in SIMULATORS or name in SAMPLED_SIMULATORS:
        check = every_check.get(name)
    elif name in builders:
        return f"{name} takes no argument (it is fitted on, or read from, the lake)"
    else:
        known = {*SIMULATORS, *SAMPLED_SIMULATORS, *builders}
        return f"unknown simulator {name!r}; known: {', '.join(sorted(known))}"
    return check(argument, Path(lake), sampling) if check else None


def check_specs(
    specs: Sequence[str],
    lake: str | Path,
    sampling: Sampling | None = None,
    lake_builders: Mapping[str, LakeBuilder] | None = None,
    checks: Mapping[str, SpecCheck] | None = None,
) -> None:
    """Raise :class:`SimulatorSpecError` naming every spec that cannot be evaluated (all of them, so
    one run lists every problem); no spec at all is a problem too."""
    if not specs:
        raise SimulatorSpecError(["no --simulator given"])
    chosen = sampling or Sampling()
    found = {spec: spec_problem(spec, lake, chosen, lake_builders, checks) for spec in specs}
    problems = [f"--simulator {spec!r}: {problem}" for spec, problem in found.items() if problem]
    if problems:
        raise SimulatorSpecError(problems)
