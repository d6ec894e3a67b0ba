"""Commands that read stacks: list, show, check, render, schema (images: images.py)."""

from __future__ import annotations

import json

import click
from rich.table import Table

from builder.cli.app import (
    Settings,
    allow_floating_option,
    cli,
    out,
    pass_settings,
    user_errors,
)
from builder.cli.list_memo import keep_listing
from builder.errors import StackError
from builder.image.names import HASH_CHARS
from builder.image.records import Record, load_record, record_path
from builder.image.uptodate import fingerprint
from builder.judge.judgement import judge
from builder.lock.locked import lock_stack
from builder.manifest.model import Manifest
from builder.manifest.resolve import stack_names
from builder.manifest.rules import Violation
from builder.render.context import write_context


@cli.command("list")
@pass_settings
@user_errors
def list_stacks(settings: Settings) -> None:
    """Stacks with status, targets and whether their current content hash is built, tested
    and pushed."""
    taken = fingerprint(settings.stacks_dir, [])
    #: What the listing read beyond the fingerprinted folders (list_memo keeps their metadata).
    wheels: list[str] = []
    records: list[str] = []
    table = Table(
        "stack",
        "status",
        "gpus",
        "cuda",
        "vllm",
        "moe backend",
        "check",
        "content",
        "built",
        "static",
        "served",
        "pushed",
    )
    #: Rows that could not be filled in, with the whole message (and what to run) for each.
    problems: list[str] = []
    for name in stack_names(settings.stacks_dir):
        row, problem, read = _list_row(settings, name)
        table.add_row(*row)
        problems += [problem] if problem else []
        wheels += read["wheels"]
        records += read["records"]
    with out.capture() as captured:
        out.print(table)
    listing = captured.get() + "".join(f"{problem}\n" for problem in problems)
    click.echo(listing, nl=False)
    keep_listing(settings.build_dir, settings.stacks_dir, taken, wheels, records, listing)


def _list_row(settings: Settings, name: str) -> tuple[list[str], str | None, dict[str, list[str]]]:
    """One stack's row of `list`, the problem that cut it short (None: none), and the files it
    read beyond the fingerprinted folders (its wheels, its record) for list_memo."""
    read: dict[str, list[str]] = {"wheels": [], "records": []}
    try:
        stack = settings.resolve(name)
    except StackError:
        return [name, "invalid", "", "", "", "", f"`check {name}` says why"], None, read
    m = stack.manifest
    vllm = m.python.packages.get("vllm")
    manifest = [
        name,
        m.status,
        " ".join(m.gpus),
        m.cuda,
        vllm.version if vllm else "-",
        m.serve.moe_backend or "-",
    ]
    violations: list[Violation] = []  # the rules that fire, in the judge's order
    try:
        judgement = judge(lock_stack(stack), allow_floating=True)  # the lock read once
        violations = judgement.violations
        if judgement.locked.stale is not None:
            raise judgement.locked.stale
        rendered = settings.render_locked(judgement.locked)
        content_hash = rendered.content_hash()
        read["wheels"] = [str(copied.source) for copied in rendered.copied.values()]
    except StackError as exc:  # a stale or broken lock, a patch file gone, ...
        stale = exc.key == "inputs_hash"
        problem = "lock stale" if stale else "no render"
        check = _first_rule(violations[0]) if violations else problem
        return [*manifest, check, "-", "?", "?", "?"], f"{name}: {exc}", read
    verdict = "ok" if not violations else _first_rule(violations[0])
    read["records"] = [str(record_path(settings.build_dir, name, content_hash))]
    try:
        record = load_record(settings.build_dir, name, content_hash)
    except StackError as exc:
        cells = [*manifest, verdict, content_hash[:HASH_CHARS], "record unreadable"]
        return cells, f"{name}: {exc}", read
    return (
        [
            *manifest,
            verdict,
            content_hash[:HASH_CHARS],
            "yes" if record.image_id else "no",
            record.static or _verdict(record),
            _served(record),
            ", ".join(record.pushed) or "no",
        ],
        None,
        read,
    )


def _first_rule(violation: Violation) -> str:
    """The rule that blocks the stack, and the upgrade that would retire it where one is known."""
    affects = violation.rule.affects
    if affects is None or affects.fixed_in is None:
        return f"rule: {violation.rule.id}"
    return f"rule: {violation.rule.id} (fixed in {affects.package} {affects.fixed_in})"


def _served(record: Record) -> str:
    """The GPU kinds the image served on (a failed one marked), or why it has none."""
    if record.served:
        return ", ".join(v.gpu_kind + ("" if v.passed else " FAILED") for v in record.served)
    return "skipped" if (record.smoke or "").startswith("skipped") else "no"


def _verdict(record: Record) -> str:
    if record.tests == "passed" and (record.smoke or "").startswith("skipped"):
        return "passed, smoke skipped"
    return record.tests or "no"


@cli.command()
@click.argument("stack")
@pass_settings
@user_errors
def show(settings: Settings, stack: str) -> None:
    """The resolved manifest (after extends) with its derived arch flags, as JSON."""
    click.echo(json.dumps(settings.resolve(stack).to_json(), indent=2, sort_keys=True))


@cli.command()
@click.argument("stacks", nargs=-1)
@allow_floating_option
@pass_settings
@user_errors
def check(settings: Settings, stacks: tuple[str, ...], allow_floating: bool) -> None:
    """Validate stacks and their compatibility rules (all stacks when none are named)."""
    names = list(stacks) or stack_names(settings.stacks_dir)
    failures: list[tuple[str, StackError]] = []
    for name in names:
        try:
            locked = settings.locked(name, allow_floating)
            note = f" (floating base: {', '.join(locked.floating)})" if locked.floating else ""
            click.echo(f"ok  {name}{note}")
        except StackError as exc:
            click.echo(f"BAD {name}", err=True)
            failures.append((name, exc))
    if len(failures) == 1:
        raise failures[0][1]
    if failures:
        each = "\n".join(
            f"- {name}: {str(exc).replace(chr(10), chr(10) + '  ')}" for name, exc in failures
        )
        raise StackError(f"{len(failures)} stacks failed:\n{each}")


@cli.command("render")
@click.argument("stack")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the Dockerfile only.")
@pass_settings
@user_errors
def render_cmd(settings: Settings, stack: str, to_stdout: bool) -> None:
    """Write the complete build context to BUILD_DIR/STACK/context and print its path."""
    rendered = settings.render_locked(settings.locked(stack, allow_floating=True))
    if to_stdout:
        click.echo(rendered.dockerfile, nl=False)
        return
    from builder.image.build import stack_dir_lock  # the one lock builds take; only here

    with stack_dir_lock(settings.build_dir / stack):
        click.echo(write_context(rendered, settings.build_dir / stack / "context"))


@cli.command()
def schema() -> None:
    """The manifest JSON Schema, for editors."""
    document = Manifest.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "sm120-stacks manifest"
    click.echo(json.dumps(document, indent=2, sort_keys=True))
