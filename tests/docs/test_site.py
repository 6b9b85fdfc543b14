"""The documentation site builds with ``mkdocs build --strict`` and no warning, its generated
references hold every setting, command and route, and every ``agent-gateway`` command line the
pages (and the README) show is a valid invocation of the real command line."""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from agent_gateway import config
from agent_gateway.cli.main import app

from tests.docs import pages


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=pages.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = build.stdout + build.stderr
    assert build.returncode == 0, output
    warnings = [line for line in output.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert warnings == [], output
    return folder


def page_text(site: Path, page: str) -> str:
    return html.unescape((site / page / "index.html").read_text())


def test_no_page_shows_an_escaped_pipe(site: Path) -> None:
    # GitHub wants "\\|" in a table's code span; Python-Markdown keeps the backslash there.
    assert [page for page in site.rglob("*.html") if "\\|" in page.read_text()] == []


def test_the_settings_reference_holds_every_setting(site: Path) -> None:
    text = page_text(site, "reference/settings")
    for key in config._KEYS:
        assert f"<code>{key.dotted}</code>" in text
        assert f"<code>{key.env}</code>" in text
    # The settings' texts link to pages from the site's root; the hook made them relative.
    assert '<a href="../../operate/logs/">Logs</a>' in text


def test_the_cli_reference_holds_every_command_and_option(site: Path) -> None:
    text = page_text(site, "reference/cli")

    def walk(command: object, ctx: typer.Context, path: str) -> None:
        assert ctx.parent is None or f"<code>{path}</code><a class=\"headerlink\"" in text, path
        for param in command.params:  # type: ignore[attr-defined]
            for opt in param.opts:
                if opt.startswith("-"):
                    assert opt in text, (path, opt)
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                child = command.get_command(ctx, name)
                walk(child, child.context_class(child, info_name=name, parent=ctx), f"{path} {name}")

    root = typer.main.get_command(app)
    walk(root, root.context_class(root, info_name="agent-gateway"), "agent-gateway")


@pytest.mark.parametrize(("page", "server"), [("reference/public-api", "public"), ("reference/agent-api", "agent")])
def test_the_http_references_hold_every_route_of_their_server(site: Path, page: str, server: str) -> None:
    sys.path.insert(0, str(pages.DOCS))
    try:
        import hooks  # the hook's own in-process build of the server's /openapi.json
    finally:
        sys.path.remove(str(pages.DOCS))
    text = page_text(site, page)
    spec = hooks.openapi(server)
    for path, item in spec["paths"].items():
        for method in item:
            assert f"<code>{method.upper()} {path}</code><a class=\"headerlink\"" in text
    assert "422" not in text.split("<h2", 1)[1]  # the servers never send FastAPI's 422


def documented_invocations() -> list[tuple[str, str]]:
    found = []
    for path in [*pages.pages(), pages.ROOT / "README.md"]:
        for block in pages.shell_blocks(path.read_text()):
            for line in pages.shell_lines(block):
                for args in pages.invocations(line):
                    found.append((str(path.relative_to(pages.ROOT)), shlex.join(args)))
    return found


def test_the_readme_links_to_files_that_exist() -> None:
    # GitHub shows the README outside the site, so its links are to the pages' files.
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (pages.ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10
    assert [link for link in local if not (pages.ROOT / link).is_file()] == []


def test_the_pages_show_many_command_lines() -> None:
    # Guards the extraction below: a change of fence or prompt style must not make it find nothing.
    found = documented_invocations()
    assert len(found) >= 30
    assert {"docs/start/tour.md", "docs/users/auditing.md", "docs/operate/users.md"} <= {page for page, _ in found}


@pytest.mark.parametrize(("page", "line"), documented_invocations())
def test_every_command_line_shown_is_a_valid_invocation(page: str, line: str) -> None:
    [args] = list(pages.invocations("agent-gateway " + line))
    assert pages.parse(args).startswith("agent-gateway")


@pytest.mark.parametrize(
    "line",
    [
        "agent-gateway users ad",  # no such command
        "agent-gateway serve --rol api",  # no such option
        "agent-gateway users show",  # a missing argument
        "agent-gateway schedules list --limit many",  # not an integer
        "agent-gateway prune",  # a missing required option
    ],
)
def test_an_invalid_command_line_is_caught(line: str) -> None:
    [args] = list(pages.invocations(line))
    with pytest.raises(Exception) as refused:
        pages.parse(args)
    assert type(refused.value).__name__ in ("UsageError", "NoSuchOption", "BadParameter", "MissingParameter")


def test_command_lines_are_found_inside_substitutions_and_pipes() -> None:
    line = "USER_ID=$(agent-gateway users add | jq -r .id)  # admit"
    assert list(pages.invocations(line)) == [["users", "add"]]
    assert list(pages.invocations("printf '%s' \"$P\" | .venv/bin/agent-gateway users set-password $U --password-stdin")) == [
        ["users", "set-password", "$U", "--password-stdin"]
    ]
