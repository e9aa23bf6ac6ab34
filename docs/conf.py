"""Sphinx configuration of the captum-iglens API reference.

Build (warnings are errors, broken cross-references included):

    python -m sphinx -E -W --keep-going -n -b html docs docs/_build/html
"""

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

from captum_iglens.version import __version__  # noqa: E402

project = "captum-iglens"
author = "The captum-iglens maintainers"
copyright = "2026, The captum-iglens maintainers"
version = release = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",
    "apigen",  # docs/_ext/apigen.py: the API pages and the check of public names
    "pagegen",  # docs/_ext/pagegen.py: the CLI reference and the architecture table
]

# The tutorials are rendered from their committed, executed notebooks, never
# re-executed here (tests/test_tutorials.py executes them in the tests). They live
# in tutorials/ at the top of the repository; the build copies them in.
nb_execution_mode = "off"
# (docs/tutorials/, so that the pages' links to tutorials/*.ipynb resolve.)
_TUTORIALS = DOCS / "tutorials"
shutil.rmtree(_TUTORIALS, ignore_errors=True)
_TUTORIALS.mkdir(parents=True)
for notebook in sorted((ROOT / "tutorials").glob("*.ipynb")):
    shutil.copy2(notebook, _TUTORIALS / notebook.name)

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
# The generated architecture table is included whole by architectures.md.
exclude_patterns = [
    "_build",
    "README.md",
    "Thumbs.db",
    ".DS_Store",
    "_generated/architecture_table.md",
]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# Captum-style docstrings: Google-style sections (Args/Returns/Examples).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# Types render as Captum's do, ``name (type): text``, as text: the type words of a
# docstring ("Tensor", "optional", "list[int]") are not references.
napoleon_use_param = False
napoleon_use_keyword = False
# "Returns:" and "Attributes:" as Captum writes them: free text (``*Tensor* of
# ...``), and ``name (type): text`` entries like the arguments.
napoleon_custom_sections = ["Returns", ("Attributes", "params_style")]
autodoc_inherit_docstrings = False
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_mock_imports = ["nnsight", "transformer_lens"]

# Broken cross-references fail the build (-n). Other libraries' names cannot be
# resolved without the network (no intersphinx inventory can be fetched), and
# private helpers (a path component starting with "_") have no page: references
# to either render as code, unlinked.
nitpicky = True
_EXTERNAL = (
    "torch|np|numpy|transformers|captum|matplotlib|scipy|abc|typing|collections"
    "|enum|argparse|pathlib|os|io|json|dataclasses|functools|builtins"
)
nitpick_ignore_regex = [
    (r"py:.*", rf"({_EXTERNAL})(\..*)?"),
    (r"py:.*", r"captum_iglens(\.\w+)*\._\w+.*"),
]

# Objects are shown by their names; each page's title is the module path.
add_module_names = False

html_theme = "furo"
html_title = f"captum-iglens {__version__}"
html_static_path: list = []
