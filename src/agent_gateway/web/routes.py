"""Public server: the chat page at ``/`` and its assets under ``/web/``.

The files ship inside the package (``static/``) and are read once, when the
routes are built: a request never touches the disk, and nothing is fetched
from anywhere else (no CDN; the page works without internet). Every answer
carries a strict Content-Security-Policy: the page runs only its own script
and style files and talks only to its own origin.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from starlette.responses import Response

from agent_gateway import errors
from agent_gateway.http.app import router as new_router

PAGE = "index.html"
ASSET_PREFIX = "/web/"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
# No inline script or style, no framing, every fetch and asset from this origin only.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # Revalidated on every load, so an upgraded gateway serves its new page at once.
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, tuple[bytes, str]]:
    """Every shipped file by name: its bytes and its media type."""
    folder = resources.files(__package__).joinpath("static")
    files = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


def _answer(content: bytes, media_type: str) -> Response:
    return Response(content, media_type=media_type, headers=SECURITY_HEADERS)


def public_router() -> APIRouter:
    """The page's routes; ``gateway.py`` includes them unless ``public.chat_page`` is false."""
    files = _load()
    page = files.pop(PAGE)
    public = new_router()

    @public.get("/", include_in_schema=False)
    async def chat_page() -> Response:
        return _answer(*page)

    @public.get(ASSET_PREFIX + "{name}", include_in_schema=False)
    async def chat_asset(name: str) -> Response:
        if name not in files:
            raise errors.NotFound("no such file")
        return _answer(*files[name])

    return public
