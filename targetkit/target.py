"""A system under test, described once: the record `--target NAME` finds, on the supervisor's side
and on the worker's alike (`targetkit.registry`).

A target says what it promises (which decides a violation's class: breaking a rule that rests on
a promise the target never made is a CONTRACT finding, anything else is DAMAGE) and which of its
own documents say what of each finding (a broken promise, documented behaviour, or beyond what
the target ever claimed); which module runs its turns in a worker (`adapter`) and which reads its
durable store (`schema`); its options and the promises each changes; the kill points it never
reaches and why; what must be installed for it; and whether the warm fork-server template can
start its workers and what that template imports for them first.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from targetkit.schema import SchemaReader

# What a violation is about beyond its invariant (derived by the checker): the second half of the
# (invariant, condition) keys of `Promises.promised` / `.documented`. ANY: every condition of the invariant.
ANY = "*"
REQUEST_NOT_DURABLE = "request-not-durable"    # durable-before-effect: no durable row asked for the call
                                               # (whether or not its dispatch intent was there)
INTENT_NOT_DURABLE = "intent-not-durable"      # durable-before-effect: only the dispatch intent was missing
RAN_UNDISPATCHED = "ran-undispatched"          # effect-semantics: ran more often than durably dispatched
RERUN = "rerun"                                # effect-semantics: a call ran (or a write was applied) more
                                               # than its policy allows, after its worker was killed
RERUN_AFTER_CHECKPOINT_KILL = "rerun-after-checkpoint-kill"  # ... killed inside the save of the next
                                               # checkpoint after the call ran (LangGraph's put(), issue #8039)
EFFECT_MISMATCH = "effect-mismatch"            # effect-semantics: any other (a result of a run that never
                                               # was, a cancelled call that ran, an outcome dropped, a write lost)
RESULT_PREVIEW = "result-preview"              # result-fidelity: the stored result is a shortened preview
                                               # of what the tool returned (its beginning, with a note)


@dataclass(frozen=True)
class Promises:
    """What a target promises beyond a durable transcript. A violation of a rule that rests on
    a promise the target does not make is classed CONTRACT, not DAMAGE.

    Apart from the class, what the target's own documents say of each violation, keyed by
    (invariant, condition) (condition: one of the names above, or ANY): `promised` names the
    document saying it cannot happen (the violation is a broken promise), `documented` the one
    saying it can (documented behaviour); anything else is this project's contract, which the
    target never claimed (beyond promise), resting on `claims`, the document of what it does
    claim. `contract` set means the target promises this project's whole contract, on that
    document: every violation is then a broken promise (ours).
    """

    dispatch_intents: bool = True     # a durable intent precedes every tool run
    durable_requests: bool = True     # the assistant's tool-call row is durable before its tools run
    stream_retraction: bool = True    # streamed text ends committed or explicitly retracted
    durable_projections: bool = True  # nothing is shown before it is durable
    private_files: bool = False       # its files are 0600 and its directories 0700 (judged only when promised)
    counted_model_calls: bool = False  # the `api_calls` it reports are the model requests it made for the turn
    # A tool result longer than this many characters is kept in the transcript as a preview naming
    # a file that holds it whole, and no shorter one is (judged only when given).
    spills_results_over: int | None = None
    # Run with a compaction bound (ours: `--compact-above N`), it compacts the session before a turn
    # whose older rows took it over the bound (judged only when promised).
    compacts_between_turns: bool = False
    # ... and inside a turn: after a tool block whose results are all durable, before the next model
    # call, when the block took the session over the bound with an older turn live (judged only when promised).
    compacts_inside_turns: bool = False
    promised: Mapping[tuple[str, str], str] = field(default_factory=dict)
    documented: Mapping[tuple[str, str], str] = field(default_factory=dict)
    claims: str = ""
    contract: str = ""


def plain_loop(claims: str) -> Promises:
    """What a hand-written agent loop usually promises: its transcript (no row lost or duplicated,
    every call answered once, one answer a turn, an at-most-once tool never run twice, nothing shown
    before it is saved), but no dispatch intent written before a tool runs and no retraction of
    streamed text. A finding that rests only on those two is a `contract` finding, not `damage`.
    `claims`: the document that says what the loop does claim."""
    return Promises(dispatch_intents=False, stream_retraction=False, claims=claims)


def at_least_once_framework(claims: str, rerun_doc: str) -> Promises:
    """What a framework of checkpointed steps (LangGraph's nodes) usually promises: a step's writes
    are saved once it returns, and a step a kill stopped mid-way runs again on resume, as `rerun_doc`
    documents (such a rerun is documented behaviour). It writes no dispatch intents, shows a step's
    output before its checkpoint is saved, and retracts no streamed text."""
    return Promises(dispatch_intents=False, stream_retraction=False, durable_projections=False,
                    documented={("effect-semantics", RERUN): rerun_doc}, claims=claims)


OUR_CONTRACT = "this project's docs/contract.md, The durability contract (each invariant: docs/chaos.md, The verdict)"
FULL_PROMISES = Promises(contract=OUR_CONTRACT, private_files=True, counted_model_calls=True)


_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A free-form option's kinds (`TargetOption.import_path`, `TargetOption.tool_policies`).
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATH = re.compile(rf"{_IDENT}(?:\.{_IDENT})*(?::{_IDENT}(?:\.{_IDENT})*)?")
POLICY_NAMES = ("idempotent", "at_most_once", "read_only")
TOOL_POLICIES = re.compile(r"[A-Za-z0-9_.-]{1,64}:(?:%s)(?:,[A-Za-z0-9_.-]{1,64}:(?:%s))*"
                           % ("|".join(POLICY_NAMES), "|".join(POLICY_NAMES)))


class OptionError(ValueError):
    """A target option that is unknown to the target or has a value it does not take (one line)."""


@dataclass(frozen=True)
class TargetOption:
    """One option of a target (`--target-option KEY=VALUE`): the values it takes, and the one it has when not given.

    A choice option lists its values (`choices`, `default` one of them; `KEY=all` runs a campaign per
    value). A free-form option (`pattern` set: made with `import_path` or `tool_policies`) takes any
    value that full-matches it, has no default (not given, it is absent from the target's options),
    and cannot be spread with `KEY=all`.
    """

    choices: tuple[str, ...]
    default: str
    help: str = ""
    pattern: str = ""  # a free-form option: the regular expression its value must full-match
    form: str = ""     # a free-form option: its value's form as a person reads it ("MODULE:NAME")

    def __post_init__(self) -> None:
        if self.pattern:
            if self.choices or self.default:
                raise ValueError("a free-form target option (pattern) lists no choices and has no default")
            return
        # A value names a campaign's subdirectory when a campaign runs once per value (KEY=all).
        bad = [c for c in self.choices if not _VALUE.fullmatch(c) or c == "all"]
        if bad or self.default not in self.choices:
            raise ValueError(f"target option values are letters, digits, '.', '_' or '-' (not first), never "
                             f"'all', and the default one of them: {self.choices!r} (default {self.default!r})")

    @classmethod
    def import_path(cls, help: str = "") -> "TargetOption":
        """A free-form option naming a Python object to import: `package.module:attribute` (or a module).
        Never a file path: the module is found on the import path, as `python -m` finds it."""
        return cls((), "", help, pattern=IMPORT_PATH.pattern, form="package.module:NAME")

    @classmethod
    def tool_policies(cls, help: str = "") -> "TargetOption":
        """A free-form option declaring tools' effect policies: `TOOL:POLICY[,TOOL:POLICY...]`, each
        POLICY one of idempotent, at_most_once, read_only (`parse_policies`)."""
        return cls((), "", help, pattern=TOOL_POLICIES.pattern, form=f"TOOL:{'|'.join(POLICY_NAMES)}[,...]")

    @property
    def free(self) -> bool:
        return bool(self.pattern)

    def refusal(self, value: str) -> str | None:
        """Why this option does not take `value`, or None."""
        if not self.free:
            return None if value in self.choices else f"takes {', '.join(self.choices)}, not {value!r}"
        module = value.partition(":")[0]
        file_like = "/" in value or "\\" in value or module.endswith(".py")
        if re.fullmatch(self.pattern, value) and not (self.pattern == IMPORT_PATH.pattern and file_like):
            return None
        hint = ""
        if self.pattern == IMPORT_PATH.pattern and file_like:
            hint = " (an import path found on PYTHONPATH, never a file path: e.g. my_app:build for my_app.py)"
        return f"takes {self.form}, not {value!r}{hint}"

    def shown(self) -> str:
        """Its values as `--list-targets` prints them."""
        return self.form if self.free else "|".join(self.choices)


def parse_policies(value: str) -> dict[str, str]:
    """`TOOL:POLICY,...` (a `tool_policies` option's value) as tool -> policy; OptionError when malformed."""
    if not value:
        return {}
    if not TOOL_POLICIES.fullmatch(value):
        raise OptionError(f"tool policies are TOOL:{'|'.join(POLICY_NAMES)}[,...], not {value!r}")
    return dict(pair.rsplit(":", 1) for pair in value.split(","))


@dataclass(frozen=True)
class Target:
    name: str                        # what `--target` takes, on both the supervisor and the worker side
    description: str                 # how `--target`'s help names it
    adapter: str                     # the module that runs its turns in a worker: execute(args, link, report)
    schema: str | SchemaReader       # what reads its store: the reader, or "module[:attribute]" naming it
    promises: Promises = FULL_PROMISES  # what it promises with its options at their defaults
    # Its options, and the promises under a choice of them (None: `promises` whatever they are).
    options: Mapping[str, TargetOption] = field(default_factory=dict)
    promises_with: Callable[[Mapping[str, str]], Promises] | None = None
    unreachable: Mapping[str, str] = field(default_factory=dict)  # kill point -> why it never fires here
    # Conversation features (supervisor.chaos.conversation.FEATURES) it cannot take -> why: generated
    # mode never draws them for it, and its coverage table says so.
    unsupported: Mapping[str, str] = field(default_factory=dict)
    # Its workers start as forks of the warm template (worker.forkserver), a fresh interpreter's start-up
    # saved per worker; a target whose code cannot live through a fork sets it False and says why.
    forkserver: bool = True
    no_fork_reason: str = ""         # with forkserver=False: why (`--list-targets` shows it)
    # What that template imports before its first fork, besides our runtime: `MODULE` or
    # `MODULE:FUNCTION` (imported, then FUNCTION called), passed as `--preload` (worker.forkserver).
    preload: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()    # importable modules it needs (looked up, never imported)
    extra: str | None = None         # this project's pip extra that installs it
    package: str | None = None       # the distribution that extra installs
    install_hint: str = ""           # one line saying how to get it
    # A user's own app the target can run instead of its own agent (their LangGraph graph, their Agents
    # SDK agent), chosen by its options: "module:function" naming `app_tools(options)`, which returns the
    # app's tools ({"name", "description", "parameters" (JSON schema), "policy"} each) for a campaign to
    # call, or None when the options name no app (raising ValueError, one line, when the app is unusable).
    app_tools: str | None = None

    def workers(self) -> str:
        """How its workers start, as `--list-targets` says it."""
        if self.forkserver:
            return "workers: forks of the warm template"
        return f"workers: fresh interpreters ({self.no_fork_reason or 'its record sets forkserver=False, without a reason'})"

    def check_options(self, given: Mapping[str, str]) -> dict[str, str]:
        """Every option of the target with its value: `given` checked (OptionError), the rest at their defaults."""
        for key, value in given.items():
            option = self.options.get(key)
            if option is None:
                known = ", ".join(sorted(self.options)) or "none"
                raise OptionError(f"--target {self.name} has no option {key!r} (its options: {known})")
            why = option.refusal(value)
            if why is not None:
                raise OptionError(f"--target {self.name}'s option {key} {why}")
        # A free-form option not given is absent, so a campaign without it keeps the options (and the
        # plan hash and campaign id) it had before the option existed.
        return {key: given.get(key, option.default) for key, option in self.options.items()
                if key in given or not option.free}

    def spread(self, key: str) -> tuple[str, ...]:
        """The values `--target-option KEY=all` runs a campaign for: a choice option's every value.
        OptionError for an option the target does not have, or a free-form one."""
        option = self.options.get(key)
        if option is None:
            known = ", ".join(sorted(self.options)) or "none"
            raise OptionError(f"--target {self.name} has no option {key!r} (its options: {known})")
        if option.free:
            raise OptionError(f"--target {self.name}'s option {key} takes {option.form}: it has no list of values "
                              "to run a campaign for each (KEY=all is for a choice option)")
        return option.choices

    def promises_for(self, options: Mapping[str, str] | None = None) -> Promises:
        """What it promises with `options` (checked; the others at their defaults)."""
        if self.promises_with is None:
            return self.promises
        return self.promises_with(self.check_options(options or {}))

    def available(self) -> bool:
        """Is everything it needs installed? Found without importing it."""
        return all(importlib.util.find_spec(name) is not None for name in self.modules)

    def missing(self) -> str | None:
        """Why it cannot run here (its install hint), or None."""
        return None if self.available() else (self.install_hint or f"--target {self.name} is not installed here")

    def reader(self) -> SchemaReader:
        """Its schema reader: `schema` itself, or what it names, "module" or "module:attribute" (imported here)."""
        if not isinstance(self.schema, str):
            return self.schema
        return load(self.schema)  # type: ignore[no-any-return]

    def own_app_tools(self, options: Mapping[str, str]) -> list[dict[str, Any]] | None:
        """The tools of the user's app `options` name (`app_tools`), or None (no app; the target's own tools)."""
        if self.app_tools is None:
            return None
        return load(self.app_tools)(dict(options))  # type: ignore[no-any-return]

    def turn_state(self, conn: sqlite3.Connection, session: str, turn_id: str) -> str | None:
        return self.reader().turn_state(conn, session, turn_id)


def load(value: str) -> Any:
    """What "module:attribute" names (the module itself for "module"), its module imported."""
    module, _, attr = value.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


def option_pairs(values: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`KEY=VALUE` strings (as `--target-option` takes them) as a mapping; OptionError for one without `=`."""
    out: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise OptionError(f"a target option is KEY=VALUE, not {value!r}")
        out[key.strip()] = rest.strip()
    return out


def as_worker_args(options: Mapping[str, str]) -> list[str]:
    """The worker's arguments that carry `options`."""
    return [arg for key, value in sorted(options.items()) for arg in ("--target-option", f"{key}={value}")]

