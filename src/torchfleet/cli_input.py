"""The command line's inputs turned into objects, or into one paragraph saying what is wrong with them.

``--model``/``--data`` class paths (``pkg.mod.Class`` or ``file.py:Class``) are imported and checked before
jsonargparse sees them, a ``--config`` file is read as YAML first, and an error raised while the Trainer, model
or data module are built from the values given (their own checks) is explained without a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from torchfleet.errors import ConfigurationError, TorchfleetError

_CLASS_PATH_FORMS = (
    "Give it as a dotted import path, 'package.module.ClassName' (importable from the current "
    "directory or an installed package), or as a file and a class, 'path/to/file.py:ClassName'."
)


def _looks_like_class_path(value: str) -> bool:
    # --model also accepts a YAML/JSON config or a bare class name; only class paths are checked here
    value = value.strip()
    if not value or value[0] in "{[" or "\n" in value or value.endswith((".yaml", ".yml", ".json")):
        return False
    return ".py:" in value or "." in value


def _import_file_class(kind: str, given: str) -> str:
    """Import ``path/to/file.py`` as a module named after the file; return its dotted class path."""
    import importlib

    file_name, _, class_name = given.rpartition(":")
    path = os.path.abspath(file_name)
    module_name = os.path.splitext(os.path.basename(path))[0]
    if not os.path.isfile(path):
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported: there is no file {path!r}. {_CLASS_PATH_FORMS}"
        )
    if not module_name.isidentifier():
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported: {os.path.basename(path)!r} is not a valid Python "
            f"module name (letters, digits and underscores only). Rename the file. {_CLASS_PATH_FORMS}"
        )
    # Prefer the dotted name relative to the current directory (sub/my_model.py -> sub.my_model):
    # --print_config then writes a class path that works again from the same directory.
    relative = os.path.splitext(os.path.relpath(path))[0].split(os.sep)
    if all(part.isidentifier() for part in relative):
        import importlib.util

        try:
            spec = importlib.util.find_spec(".".join(relative))
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and os.path.abspath(spec.origin) == path:
            module_name = ".".join(relative)
    loaded = sys.modules.get(module_name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") != path:
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported: a different module named {module_name!r} is "
            f"already imported (from {getattr(loaded, '__file__', None)!r}). Rename the file. {_CLASS_PATH_FORMS}"
        )
    # The file's folder goes on sys.path (not a one-off module spec) so that processes started by
    # the spawn launcher, which import classes by module name, find the module too.
    folder = os.path.dirname(path)
    if "." not in module_name and folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported: importing {path!r} failed with "
            f"{type(exc).__name__}: {exc}. {_CLASS_PATH_FORMS}"
        ) from exc
    return f"{module_name}.{class_name}"


def _check_class_path(kind: str, given: str, base: type | None = None) -> str:
    """Import the class ``given`` for --model/--data; return it as a dotted path, or raise one paragraph.

    ``base``: the class it must derive from (default: Module for --model, DataModule for --data)."""
    import importlib

    from torchfleet.data import DataModule
    from torchfleet.module import Module

    dotted = _import_file_class(kind, given) if ".py:" in given else given.strip()
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name or not class_name:
        raise ConfigurationError(f"--{kind} {given!r} is not a class path. {_CLASS_PATH_FORMS}")
    try:
        obj = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported ({type(exc).__name__}: {exc}). {_CLASS_PATH_FORMS}"
        ) from None
    base = base or (Module if kind == "model" else DataModule)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        named = f"torchfleet.{base.__name__}" if base in (Module, DataModule) else f"{base.__module__}.{base.__name__}"
        raise ConfigurationError(
            f"--{kind} {given!r} is {obj!r}, not a subclass of {named}. "
            f"--{kind} takes a {base.__name__} class; its constructor's arguments become --{kind}.init_args.NAME "
            f"(or --{kind}.NAME) options."
        )
    return dotted


def read_config(path: str) -> Any:
    """The YAML in the --config file ``path``, or one paragraph saying where it is not valid YAML."""
    import yaml

    try:
        with open(path) as f:
            return yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"--config {path!r} is not valid YAML: {_yaml_problem(exc)}. Fix the file "
                                 "(--print_config writes a valid one to start from).") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"--config {path!r} could not be read ({type(exc).__name__}: {exc}); give a "
                                 "readable YAML file.") from None


def check_config_files(argv: list[str]) -> None:
    """Read every --config file in ``argv`` (where the classes are fixed, ``CLI(MyModel)``, and nothing else reads
    them first): invalid YAML is reported with its file, line and column, not as jsonargparse's "<unicode string>"."""
    for i, arg in enumerate(argv):
        option, eq, value = arg.partition("=")
        if option == "--config" and not eq and i + 1 < len(argv):
            value = argv[i + 1]
        if option == "--config" and os.path.isfile(value):
            read_config(value)


def _check_config_file(path: str, bases: dict[str, type] | None = None) -> tuple[str, bool]:
    """Check a --config file's model/data class paths; returns what to pass on and whether it names a model.

    A file-form class path ('file.py:Class') is rewritten to its dotted form, and the config is then
    passed on as YAML text instead of the file's path.
    """
    if not os.path.isfile(path):
        return path, False  # jsonargparse reports a missing file, or parses YAML text given inline
    import yaml

    config = read_config(path)
    if not isinstance(config, dict):
        return path, False
    rewritten = False
    for kind in ("model", "data") if bases is None else tuple(bases):
        section = config.get(kind)
        value = section.get("class_path") if isinstance(section, dict) else section
        if isinstance(value, str) and _looks_like_class_path(value):
            dotted = _check_class_path(kind, value, (bases or {}).get(kind))
            if dotted != value:
                rewritten = True
                if isinstance(section, dict):
                    section["class_path"] = dotted
                else:
                    config[kind] = dotted
    model = config.get("model")
    # a model section without a class (only init_args) tunes the bundled example
    names_model = isinstance(model, str) or (isinstance(model, dict) and "class_path" in model)
    return (yaml.safe_dump(config) if rewritten else path), names_model


def prepare_argv(argv: list[str], bases: dict[str, type] | None = None) -> tuple[list[str], bool]:
    """Check --model/--data class paths before jsonargparse sees them; True when the example is to be trained.

    jsonargparse's own message for a class it cannot import is a page of union-type diagnostics;
    checking first gives one paragraph with the import error in it. ``bases``: the options that take a class and
    the class each must derive from (default: --model a Module, --data a DataModule); ``{}`` checks none.
    """
    options = ("--model", "--data") if bases is None else tuple(f"--{k}" for k in bases)
    out: list[str] = []
    names_model = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        option, eq, value = arg.partition("=")
        if option in (*options, "--config") and not eq and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        elif option not in (*options, "--config"):
            out.append(arg)
            i += 1
            continue
        if option == "--config":
            value, has_model = _check_config_file(value, bases)
            names_model = names_model or has_model
        else:
            names_model = names_model or option == "--model"
            if _looks_like_class_path(value):
                value = _check_class_path(option[2:], value, (bases or {}).get(option[2:]))
        out.append(f"{option}={value}")
        i += 1
    return out, not names_model


def help_formatter() -> type:
    """The help formatter of every torchfleet parser: jsonargparse's, with the Trainer's effective defaults.

    Built on first use (jsonargparse is imported then) and kept as this module's ``HelpFormatter``, so that a
    parser pickles (ddp_spawn sends LightningCLI's SaveConfigCallback, which holds its parser, to the ranks)."""
    built = globals().get("HelpFormatter")
    if built is not None:
        return built
    from jsonargparse import DefaultHelpFormatter

    from torchfleet.trainer.arguments import DEFAULTS as TRAINER_DEFAULTS

    class HelpFormatter(DefaultHelpFormatter):
        """jsonargparse's help, without "type: Any" for arguments that take several kinds of value: their
        descriptions (the Trainer's docstring) say what is accepted."""

        def _get_type_str(self, action: Any) -> str | None:
            found = super()._get_type_str(action)
            return None if found in ("Any", "Optional[Any]") else found

        def _get_help_string(self, action: Any) -> str:
            # a Trainer argument left at None takes its value from one table, which the help shows too
            text = super()._get_help_string(action)
            kind, _, name = str(action.dest).partition(".")
            if kind == "trainer" and action.default is None and name in TRAINER_DEFAULTS:
                shown = str(TRAINER_DEFAULTS[name]).replace("%", "%%")
                text = text.replace("default: %(default)s", f"default: {shown}")
            return text

    HelpFormatter.__qualname__ = "HelpFormatter"
    globals()["HelpFormatter"] = HelpFormatter
    return HelpFormatter


def __getattr__(name: str) -> Any:
    if name == "HelpFormatter":  # unpickling a parser in a new process
        return help_formatter()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _object_arguments() -> dict[str, Any]:
    """The Trainer arguments that take objects, with the types the command line builds them from.

    The Trainer annotates them ``Any`` (it accepts many forms and checks them itself); typed here, jsonargparse
    builds ``--trainer.callbacks+=EarlyStopping --trainer.callbacks.monitor=val_loss`` and
    ``--trainer.logger=CSVLogger`` as Lightning's command line does."""
    from torchfleet.accelerators.base import Accelerator
    from torchfleet.checkpoint.io import CheckpointIO
    from torchfleet.environments import ClusterEnvironment
    from torchfleet.loggers.base import Logger
    from torchfleet.precision import Precision
    from torchfleet.profilers.base import Profiler
    from torchfleet.strategies.strategy import Strategy
    from torchfleet.trainer.callbacks.base import Callback

    # each ends in str: a value that names no class reaches the Trainer, whose error says what it accepts
    plugin = Precision | CheckpointIO | ClusterEnvironment | str
    return {
        "accelerator": Accelerator | str,
        "strategy": Strategy | str,
        "callbacks": list[Callback] | Callback | str | None,
        "logger": Logger | list[Logger] | bool | str | None,
        "plugins": list[plugin] | plugin | None,
        "profiler": Profiler | str | None,
    }


def add_trainer_arguments(parser: Any, trainer_class: type, key: str = "trainer", instantiate: bool = True) -> list[str]:
    """Add ``trainer_class``'s arguments as ``--KEY.NAME``; its object arguments typed so that class paths build.

    Returns the names added, as jsonargparse's ``add_class_arguments`` does."""
    import inspect

    typed = _object_arguments()
    # a class made from a function (jsonargparse's class_from_function) takes that function's arguments
    builder = getattr(trainer_class, "wrapped_function", None) or trainer_class.__init__
    params = inspect.signature(builder).parameters
    # only the arguments the class leaves untyped: a subclass's own annotation is respected
    retyped = {name: typed[name] for name, p in params.items() if name in typed and p.annotation in (Any, "Any")}
    added = list(parser.add_class_arguments(trainer_class, key, instantiate=instantiate, fail_untyped=False,
                                            sub_configs=True, skip=set(retyped)))
    docs = _argument_docs(trainer_class)
    for name, kind in retyped.items():
        parser.add_argument(f"--{key}.{name}", type=kind, default=params[name].default, help=docs.get(name))
        added.append(f"{key}.{name}")
    return added


def _argument_docs(cls: type) -> dict[str, str]:
    """The descriptions of ``cls``'s constructor arguments in its docstrings (as jsonargparse shows them)."""
    try:
        from docstring_parser import parse
    except ImportError:  # pragma: no cover - installed with jsonargparse[signatures]
        return {}
    docs: dict[str, str] = {}
    for doc in (cls.__doc__, cls.__init__.__doc__):
        if doc:
            docs.update({p.arg_name: p.description or "" for p in parse(doc).params})
    return docs


def print_error(prog: str, exc: BaseException) -> None:
    """A library error as the command line shows it: one paragraph on stderr, after the program's name."""
    print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)


def _yaml_problem(exc: Exception) -> str:
    """What a YAML parser found, and where (1-based line and column), in one line."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if not problem:
        return " ".join(str(exc).split())
    text = f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem
    context, where = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        text += f" ({context}" + (f" that starts at line {where.line + 1}, column {where.column + 1})"
                                   if where is not None else ")")
    return text


#: which command-line section builds objects of which base class, for naming it in an error
_SECTIONS = (("torchfleet.module", "Module", "--model"), ("torchfleet.data", "DataModule", "--data"),
             ("torchfleet.trainer.trainer", "Trainer", "--trainer"),
             ("torchfleet.trainer.callbacks.base", "Callback", "--trainer.callbacks"),
             ("torchfleet.loggers.base", "Logger", "--trainer.logger"))


def _section(cls: type) -> str:
    for module, name, option in _SECTIONS:
        base = getattr(sys.modules.get(module), name, None)
        if isinstance(base, type) and issubclass(cls, base):
            return option
    return ""


def _raised_by_jsonargparse(exc: BaseException) -> bool:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and f"{os.sep}jsonargparse{os.sep}" in frames[-1].filename


def explain_build_error(exc: Exception, builder: type | None = None) -> TorchfleetError:
    """One paragraph for an error raised while building the Trainer, model or data from the command line's values.

    jsonargparse wraps the constructor's own error (a check that rejects an argument) in pages of union-type
    diagnostics; the cause is the innermost exception. The paragraph names the class being built with the values
    it was given, the error, and where it was raised. ``builder``: the class whose constructor builds the others
    (LightningCLI), never the one named.
    """
    import inspect
    import traceback

    cause: BaseException = exc
    while cause.__cause__ is not None and _raised_by_jsonargparse(cause):
        cause = cause.__cause__
    built, values = None, ""
    tb = cause.__traceback__
    while tb is not None and built is None:  # the outermost constructor in the cause's traceback: the class built
        frame = tb.tb_frame
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if owner is not None and not (builder is not None and isinstance(owner, builder)):
            built = type(owner)
            try:
                names = [n for n in inspect.signature(built.__init__).parameters if n != "self"]
            except (TypeError, ValueError):
                names = []
            values = ", ".join(f"{n}={frame.f_locals[n]!r}" for n in names if n in frame.f_locals)
        tb = tb.tb_next
    what = f"{_section(built)} {built.__name__}({values})".strip() if built is not None else "the configuration"
    message = " ".join(str(cause).split()) or "(no message)"
    if isinstance(cause, TorchfleetError):  # its message names the argument and what is accepted
        return cause
    frames = traceback.extract_tb(cause.__traceback__)
    where = f" (raised at {frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return ConfigurationError(
        f"{what} could not be built from the values given: {type(cause).__name__}: {message}{where}. Change the "
        "values on the command line or in --config (`--help` lists every option)."
    )


def usage_error(prog: str, message: str) -> ConfigurationError:
    """jsonargparse's usage error (``message``) as one paragraph: the option, the value given, what it expects.

    jsonargparse prints the whole usage (fifty lines for ``fit``) and a multi-line diagnosis of each union type; the
    option and the types it expects are all a user needs, with where to read the rest."""
    import re

    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", message).replace("NoneType", "None")
    found = re.match(r'\s*Parser key "([^"]+)":\s*(.*)', text, re.S)
    if found is None:
        return ConfigurationError(f"{' '.join(text.split()).rstrip('.')}. `{prog} --help` lists the options.")
    key, detail = found.groups()
    given = re.search(r"(?:Given value|Got value): (.*?)\s*$", detail, re.S)
    subtypes = re.search(r"Subtypes: \[(.*?)\]", detail)
    single = re.match(r"\s*Expected an? (\w+)\. Got value", detail)
    if single is not None:
        expected = f"expected {single.group(1)}"
    elif subtypes is not None:
        expected = f"expected {' or '.join(t.strip() for t in subtypes.group(1).split(','))}"
    else:
        expected = " ".join(re.sub(r"Given value.*", "", detail, flags=re.S).split()).rstrip(".")
    shown = f" {given.group(1).strip()!r}" if given is not None else ""
    hint = f" {_CLASS_PATH_FORMS}" if key in ("model", "data") else ""
    return ConfigurationError(f"--{key}{shown} is not accepted: {expected}.{hint} `{prog} --help` lists every "
                              "option with its type.")


def listing_mode(command: str, argv: list[str]) -> str:
    """What ``torchfleet strategies|accelerators ARGS`` asks: "list", "help" or "explain" (strategies --explain with
    fit's options); anything else is a usage error, one paragraph."""
    usage = (f"`torchfleet {command}` takes no arguments" + ("; `torchfleet strategies --explain [fit's options]` "
             "says what strategy='auto' picks for a run" if command == "strategies" else "") + ".")
    if command == "strategies" and "--explain" in argv:
        return "explain"
    flag = next((a for a in argv if a.startswith("--explain")), None) if command == "strategies" else None
    if flag is not None:
        raise ConfigurationError(f"{flag!r} is not valid: --explain takes no value. {usage}")
    if argv[:1] in (["-h"], ["--help"]) and len(argv) == 1:
        return "help"
    if argv:
        raise ConfigurationError(f"unrecognized arguments: {' '.join(argv)}. {usage}")
    return "list"
