"""Sphinx configuration of the hpcdist documentation.

Build (CI runs exactly this, warnings are errors)::

    python -m sphinx -q -W --keep-going -b html docs /tmp/hpcdist-html

Pages are Markdown (MyST) so they read well on GitHub too; the API
reference (``api.rst``) is generated from the docstrings by autodoc.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)  # document the checkout, not an installed copy

project = "hpcdist"
author = "the hpcdist developers"
copyright = "the hpcdist developers"
try:
    from hpcdist._version import __version__ as release
except ImportError:  # pragma: no cover
    release = "0+unknown"
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: `{toctree}` blocks, `name.md#section-title` links, ::: fences.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# autodoc: signatures without type hints (they are in the source and in
# py.typed); members in source order; importing hpcdist does no MPI work.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_mock_imports = ["cupy", "h5py"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Cross references that cannot be resolved (torch, mpi4py, private helpers)
# stay plain text instead of failing the build.
nitpicky = False
suppress_warnings = [
    "toc.not_included",  # a page in a subfolder added before it is linked
]

html_theme = "alabaster"
html_title = f"hpcdist {release}"
html_theme_options = {
    "description": "torch.distributed's programming model on MPI",
    "fixed_sidebar": True,
    "page_width": "1100px",
    "sidebar_width": "240px",
}
html_static_path: list[str] = []
html_show_sourcelink = False


def _document_new_public_names(app, docname, source):
    """Append to api.rst every name of ``hpcdist.__all__`` it does not document yet.

    The reference stays complete when a name is added to the facade before
    the page is edited; such names land under "Other public names".
    """
    if docname != "api":
        return
    import re

    import hpcdist

    documented = set(re.findall(r"^\.\. auto\w+:: (\w+)", source[0], re.MULTILINE))
    missing = [n for n in hpcdist.__all__ if n not in documented and not n.startswith("__")]
    if not missing:
        return
    lines = ["", "Other public names", "------------------", "", ".. currentmodule:: hpcdist", ""]
    for name in missing:
        obj = getattr(hpcdist, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            kind = "autoexception"
        elif isinstance(obj, type):
            kind = "autoclass"
        elif callable(obj):
            kind = "autofunction"
        else:
            kind = "autodata"
        lines.append(f".. {kind}:: {name}")
    source[0] += "\n".join(lines) + "\n"


def _list_new_pages(app, docname, source):
    """Append to the index's toctree (the last block of index.rst) every top-level page it lacks.

    A page another engineer adds to docs/ then appears in the site at once,
    and the build does not fail on an unlisted page.
    """
    if docname != "index":
        return
    import re

    text = source[0]
    listed = set(re.findall(r"^   ([\w/-]+)\s*$", text, re.MULTILINE))
    extra = sorted(d for d in app.env.found_docs if "/" not in d and d != "index" and d not in listed)
    if extra:
        source[0] = text.rstrip("\n") + "\n" + "".join(f"   {d}\n" for d in extra)


def setup(app):
    app.connect("source-read", _document_new_public_names)
    app.connect("source-read", _list_new_pages)
    return {"parallel_read_safe": True}
