"""Headless Chromium for the tests of tide's web page (the live job page,
src/launcher/page/job.html): load a URL, let its scripts run for a budget
of virtual time, and read back the DOM or a screenshot; and a small DOM to
check what was read.

    sys.path.insert(0, "tests/support")
    import browser
    if browser.chromium() is None: skip
    root = browser.parse_html(browser.dump_dom(url, budget_ms=5000))
    card = root.find("article", data_node="host-a")
    browser.screenshot(url, "job.png", size=(1280, 900))

Each call starts a fresh browser with a profile of its own, so tests may run
side by side. Virtual time runs the page's timers (its 2 s polls) as fast
as the page is idle, and waits for its requests.
"""
import html.parser
import os
import shutil
import struct
import subprocess
import tempfile

TIMEOUT = 90  # seconds one browser run gets before it counts as hung


class BrowserError(RuntimeError):
    """Chromium failed or hung; the message carries the tail of its stderr."""


def chromium():
    """The browser to run: $TIDE_CHROMIUM, else Debian's chromium (or one on
    PATH); None when there is none."""
    for candidate in (os.environ.get("TIDE_CHROMIUM"), "/usr/bin/chromium", "chromium",
                      "chromium-browser"):
        if candidate:
            path = shutil.which(candidate)
            if path:
                return path
    return None


def _run(url, flags, budget_ms, timeout):
    exe = chromium()
    if exe is None:
        raise BrowserError("no chromium: install Debian's chromium or set TIDE_CHROMIUM")
    with tempfile.TemporaryDirectory(prefix="tide-chromium-") as profile:
        cmd = [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--mute-audio", "--hide-scrollbars", f"--user-data-dir={profile}",
            f"--virtual-time-budget={int(budget_ms)}", *flags, url,
        ]
        # A browser of its own: a hung one is killed with what it started.
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                               start_new_session=True, cwd=profile)
        except subprocess.TimeoutExpired as e:
            raise BrowserError(f"chromium hung on {url}: no exit within {timeout} s; stderr: "
                               f"{_tail(e.stderr)}") from None
    if p.returncode != 0:
        raise BrowserError(
            f"chromium exited with {p.returncode} on {url}; stderr: {_tail(p.stderr)}")
    return p


def _tail(err, lines=15):
    if isinstance(err, bytes):
        err = err.decode(errors="replace")
    return "\n".join((err or "").splitlines()[-lines:])


def dump_dom(url, budget_ms=5000, size=None, timeout=TIMEOUT):
    """The page's DOM, serialised, once its scripts ran for `budget_ms` of
    virtual time. `size` (width, height) sets the window, which the page's
    layout may read. Raises BrowserError."""
    flags = ["--dump-dom"]
    if size:
        flags.append(f"--window-size={size[0]},{size[1]}")
    return _run(url, flags, budget_ms, timeout).stdout


def screenshot(url, path, size=(1280, 900), budget_ms=5000, timeout=TIMEOUT):
    """A PNG of the window (`size`, width and height) at `path`, once the
    page's scripts ran for `budget_ms` of virtual time; returns path. Raises
    BrowserError, also when no file came."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        os.remove(path)
    _run(url, [f"--screenshot={path}", f"--window-size={size[0]},{size[1]}"], budget_ms, timeout)
    if not os.path.exists(path):
        raise BrowserError(f"chromium wrote no screenshot at {path}")
    return path


def png_size(path):
    """(width, height) of a PNG file; ValueError when it is none."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is no PNG")
    return struct.unpack(">II", head[16:24])


# --- A small DOM over what dump_dom returns.

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
         "track", "wbr"}


class Element:
    """An element of a parsed page: tag, attrs (a dict; names lower-case as
    HTML parsing makes them), children (Elements and strings), parent."""

    def __init__(self, tag, attrs, parent=None):
        self.tag = tag
        self.attrs = dict(attrs)
        self.children = []
        self.parent = parent

    def get(self, name, default=None):
        return self.attrs.get(name, default)

    @property
    def classes(self):
        return set((self.attrs.get("class") or "").split())

    @property
    def text(self):
        """The text of the element and everything in it."""
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def iter(self):
        """This element and every element in it, in document order."""
        yield self
        for c in self.children:
            if isinstance(c, Element):
                yield from c.iter()

    def find_all(self, tag=None, class_=None, **attrs):
        """The elements in this one (itself included) with that tag, that
        class among theirs, and those attributes: data_node="a" matches
        data-node="a"; True matches any value."""
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        out = []
        for e in self.iter():
            if tag is not None and e.tag != tag:
                continue
            if class_ is not None and class_ not in e.classes:
                continue
            if all(name in e.attrs and (v is True or e.attrs[name] == str(v))
                   for name, v in want.items()):
                out.append(e)
        return out

    def find(self, tag=None, class_=None, **attrs):
        """The first of find_all, or None."""
        found = self.find_all(tag, class_, **attrs)
        return found[0] if found else None

    def by_id(self, ident):
        return self.find(id=ident)

    def __repr__(self):
        return f"<{self.tag} {self.attrs}>"


class _Builder(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.open = self.root

    def handle_starttag(self, tag, attrs):
        e = Element(tag, ((k, v if v is not None else "") for k, v in attrs), self.open)
        self.open.children.append(e)
        if tag not in _VOID:
            self.open = e

    def handle_startendtag(self, tag, attrs):
        self.open.children.append(
            Element(tag, ((k, v if v is not None else "") for k, v in attrs), self.open))

    def handle_endtag(self, tag):
        e = self.open
        while e is not self.root and e.tag != tag:
            e = e.parent
        if e is not self.root:
            self.open = e.parent

    def handle_data(self, data):
        self.open.children.append(data)


def parse_html(text):
    """The document of a serialised page (what dump_dom returns), as the
    root Element."""
    b = _Builder()
    b.feed(text)
    b.close()
    return b.root
