"""The model's tool calls: checked against their schema, dispatched, answered.

Owns :class:`ToolCalls`: each call of a reply is an event pair (started,
completed) and gets one answer. A call to an unknown tool, or with arguments
that do not fit the tool's full schema, is not run (a rare tool's schema is
loaded into the context so the next call can fit it); ``finalize_response``
goes to ``Host.submit``, ``execute`` runs one cell, ``tool_view`` loads a
rare tool's schema, and the skills tools read the catalog. The verifier, the
tool specs (:mod:`.layers`) and the skills catalog are not this module's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..llm import ToolCall
from .cells import CellRunner
from .events import ToolCallCompleted, ToolCallStarted, ToolLoaded
from .layers import TOOLS_BY_NAME, Tier, ToolSpec, submission_from_arguments

__all__ = ["SEARCH_BODIES", "ToolCalls"]

#: How many of the best search hits come with their bodies.
SEARCH_BODIES: Final[int] = 3


def _validate(spec: ToolSpec, arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the tool's full schema, or None when they do."""
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(dict(spec.parameters)).iter_errors(dict(arguments)),
                    key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return "; ".join(
        (f"{'.'.join(map(str, e.absolute_path))}: " if e.absolute_path else "") + e.message
        for e in errors[:5])


class ToolCalls(CellRunner):
    """The tool calls of a reply, each answered (``execute`` runs its cell as a reply's)."""

    def _tool_call(self, call_id: str, call: ToolCall, *,
                   already_accepted: bool) -> tuple[str, bool]:
        self.log.emit(ToolCallStarted(call_id, call.name, self.step, call.arguments_error))
        accepted = False
        outcome = "error"
        spec = TOOLS_BY_NAME.get(call.name)
        if already_accepted:
            content = ("not run: a submission from a cell of this reply was already accepted; "
                       "the session has ended")
        elif spec is None:
            content = (f"there is no tool named {call.name!r}. The tools are "
                       f"{', '.join(TOOLS_BY_NAME)}; or act by writing ```python cells.")
        else:
            problem = (f"its {call.arguments_error}. Send its arguments as one JSON object"
                       if call.arguments_error is not None else _validate(spec, call.arguments))
            if problem is not None:
                content = f"{call.name} was not run: {problem}."
                if spec.tier is Tier.RARE:
                    content += "\n" + self._load_tool(spec, "bad_arguments")
            else:
                outcome, content, accepted = self._run_tool(spec, call)
        self.log.emit(ToolCallCompleted(call_id, call.name, outcome, content[:2000]))
        return content, accepted

    def _load_tool(self, spec: ToolSpec, why: str) -> str:
        """Put a rare tool's schema into the loaded-tools block (once); say so."""
        if spec.name not in self.state.loaded_tools:
            self.log.emit(ToolLoaded(spec.name, why))
        return (f"The full arguments of {spec.name} are now in the loaded-tools block of your "
                f"context:\n" + json.dumps(spec.parameters, sort_keys=True, ensure_ascii=False))

    def _run_tool(self, spec: ToolSpec, call: ToolCall) -> tuple[str, str, bool]:
        """(outcome, content, accepted) of a call whose arguments fit the schema."""
        args = call.arguments
        name = spec.name
        if name == "finalize_response":
            submission, notes = submission_from_arguments(args)
            future = self.worker.submit(lambda: self.host.submit(submission))
            verdict = future.result()
            self._drain_verdicts()
            outcome = "accepted" if verdict.accepted else "refused"
            return outcome, verdict.explain() + "".join(f"\nNote: {n}." for n in notes), \
                verdict.accepted
        if name == "execute":
            if self._stopped_reply:
                return "error", ("not run: an earlier cell of this reply did not finish ok, "
                                 "so the rest of the reply is skipped"), False
            self._tool_cells += 1
            texts, accepted = self._run_cells([args["code"]],
                                              [f"s{self.step}t{self._tool_cells}"])
            return "ok", "\n\n".join(texts), accepted
        if name == "tool_view":
            target = TOOLS_BY_NAME.get(args["name"])
            if target is None:
                return "error", (f"there is no tool named {args['name']!r}; the tools are "
                                 f"{', '.join(TOOLS_BY_NAME)}"), False
            if target.tier is Tier.FREQUENT:
                return "ok", (f"{target.name} is a frequent tool: its full arguments are "
                              f"already in the tool map and the tools field."), False
            return "ok", self._load_tool(target, "tool_view"), False
        return self._skill_tool(name, args)

    def _skill_tool(self, name: str, args: Mapping[str, Any]) -> tuple[str, str, bool]:
        from ..skills import SkillError

        catalog = self.catalog
        if catalog is None:
            return "error", "no skills catalog is available in this session", False
        try:
            if name == "list_skills":
                page = catalog.list(args.get("collection"), args.get("offset", 0))
                return "ok", json.dumps(page.to_dict(), ensure_ascii=False, indent=1), False
            if name == "search_skills":
                hits = catalog.search(args["query"])
                return "ok", _render_hits(hits), False
            skill = catalog.get(args["name"])
            return "ok", f"# skill {skill.name} ({skill.collection})\n{skill.body}", False
        except SkillError as exc:
            return "error", str(exc), False


def _render_hits(hits: Sequence[Any]) -> str:
    """search_skills' answer: the best matches with their bodies, the rest by name."""
    if not hits:
        return ("no skill shares a word with the query (the search is literal: try the "
                "surface words a skill would use, or list_skills)")
    parts = [f"{len(hits)} skill(s) matched:"]
    for i, hit in enumerate(hits):
        skill = hit.skill
        head = (f"- {skill.name} ({skill.collection}, score {hit.score}, matched "
                f"{', '.join(hit.matched)}): {skill.summary}")
        parts.append(head if i >= SEARCH_BODIES else
                     f"{head}\n```markdown\n{skill.body.strip()}\n```")
    return "\n".join(parts)
