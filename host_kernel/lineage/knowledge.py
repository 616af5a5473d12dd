"""What the lineage analysis knows about libraries: figures, pure callables, modules.

This module owns the few facts about third-party and standard-library APIs
that def-use needs and the syntax tree cannot tell: which matplotlib, seaborn
and pandas calls draw into a figure or make one, which callables are known
not to mutate their arguments, and which workspace file holds a module. It is
data and small lookups only; ``host_kernel.lineage.defuse`` applies it to a
cell and ``host_kernel.lineage.flow`` to the session.

Figures (matplotlib's documented API):

* pyplot keeps an implicit *current figure*, named here :data:`CURRENT_FIGURE`
  (a pseudo-name no Python name can clash with). ``plt.figure()``,
  ``plt.subplots()`` and ``plt.subplot_mosaic()`` start a new one
  (:data:`PYPLOT_NEW`); ``plt.close()``, ``plt.clf()`` and ``plt.cla()`` clear
  it (:data:`PYPLOT_CLEAR`); ``plt.gcf()``, ``plt.gca()``, ``plt.subplot()``
  and ``plt.axes()`` return a part of it (:data:`PYPLOT_PART`);
  ``plt.savefig()`` reads it (:data:`PYPLOT_SAVE`); every other pyplot call
  that is not in :data:`PYPLOT_NEUTRAL` draws into it.
* Methods in :data:`DRAW_METHODS` (``ax.plot``, ``ax.set_title``,
  ``fig.colorbar`` ...) draw into their receiver; methods in
  :data:`PART_METHODS` (``fig.add_subplot``, ``ax.twinx`` ...) return a part
  of their receiver, so the result and the receiver are one object.
* pandas' ``df.plot(...)``, ``df.plot.bar(...)``, ``series.hist()`` and
  ``df.boxplot()`` (:data:`PANDAS_PLOT_METHODS`) draw on the current axes,
  or on ``ax=`` when given. seaborn functions draw on ``ax=`` when given,
  else on the current figure; its figure-level functions
  (:data:`SEABORN_FIGURE_LEVEL`) start a new figure; its theme setters
  (:data:`SEABORN_NEUTRAL`) draw nothing.
* A module is recognised as pyplot or seaborn by the dotted name it was
  imported as (``import matplotlib.pyplot as plt``), or by the conventional
  aliases (``plt``, ``sns``, ``np``, ``pd`` ...) when the import is not known.

Functions with state: a function decorated with one of
:data:`CACHE_DECORATORS` (``functools.lru_cache``, ``functools.cache`` ...)
keeps its results, so a later call may return what an earlier call read
without reading anything. Methods in :data:`MUTATING_METHODS` (``append``,
``setdefault``, ``update`` ...) change their receiver wherever they stand.

Reading calls: :func:`reads_named_path` says whether a call given a path
reads the file's bytes (``open``, ``pd.read_csv``, ``np.load``,
``Path.read_text`` ...: :data:`READ_CALLS` and names starting ``read``/``load``)
or only names the path (:data:`PATH_ONLY_CALLS`: ``os.symlink``,
``os.path.exists``, ``os.remove`` ...).

Pure callables (:func:`is_pure`): builtins in :data:`PURE_BUILTINS`, every
function of the modules in :data:`PURE_MODULES` except those listed in
:data:`IMPURE_FUNCTIONS` (``random.shuffle``, ``np.copyto`` ...). A call to
anything else may mutate what it is given.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "CACHE_DECORATORS", "CURRENT_FIGURE", "DRAW_METHODS", "IMPURE_FUNCTIONS", "KERNEL_NAMES",
    "MUTATING_METHODS", "PANDAS_PLOT_METHODS", "PART_METHODS", "PATH_ONLY_CALLS",
    "PURE_BUILTINS", "PURE_MODULES", "PYPLOT_CLEAR", "PYPLOT_NEUTRAL", "PYPLOT_NEW",
    "PYPLOT_PART", "PYPLOT_SAVE", "READ_CALLS", "SEABORN_FIGURE_LEVEL", "SEABORN_NEUTRAL",
    "UNKNOWN", "UNKNOWN_NAMES", "is_pure", "library_of", "module_files_match",
    "reads_named_path",
]

#: The pseudo-name of pyplot's implicit current figure.
CURRENT_FIGURE = "<current figure>"
#: The pseudo-name standing for names bound where the analysis cannot see them
#: (``from m import *``, ``%run`` of a script whose text is not known).
UNKNOWN_NAMES = "<unknown names>"

#: Names the kernel binds itself (never by a cell): not taken for unknown names.
KERNEL_NAMES = frozenset({"host", "get_ipython", "display", "In", "Out", "exit", "quit"})

#: In a path pattern: one part whose value the analysis could not know (matches like ``*``).
UNKNOWN = "\x01"

PYPLOT_MODULES = frozenset({"matplotlib.pyplot", "pylab"})
SEABORN_MODULES = frozenset({"seaborn"})
_CONVENTIONAL = {"plt": "matplotlib.pyplot", "pyplot": "matplotlib.pyplot",
                 "sns": "seaborn", "seaborn": "seaborn", "np": "numpy", "pd": "pandas",
                 "os": "os", "json": "json", "math": "math", "random": "random"}

PYPLOT_NEW = frozenset({"figure", "subplots", "subplot_mosaic"})
PYPLOT_CLEAR = frozenset({"close", "clf", "cla"})
PYPLOT_PART = frozenset({"gcf", "gca", "subplot", "axes", "subplot2grid"})
PYPLOT_SAVE = frozenset({"savefig"})
#: pyplot calls that neither draw nor read the figure
PYPLOT_NEUTRAL = frozenset({
    "show", "ion", "ioff", "isinteractive", "pause", "draw", "rc", "rcdefaults",
    "rc_context", "style", "switch_backend", "get_backend", "get_fignums", "fignum_exists",
    "colormaps", "get_cmap", "interactive", "xkcd",
})

DRAW_METHODS = frozenset({
    "plot", "bar", "barh", "hist", "hist2d", "scatter", "imshow", "matshow", "pie", "boxplot",
    "violinplot", "errorbar", "fill", "fill_between", "fill_betweenx", "step", "stem",
    "stairs", "stackplot", "hexbin", "contour", "contourf", "pcolor", "pcolormesh", "quiver",
    "streamplot", "loglog", "semilogx", "semilogy", "axhline", "axvline", "axhspan",
    "axvspan", "axline", "hlines", "vlines", "text", "annotate", "table", "legend",
    "colorbar", "suptitle", "supxlabel", "supylabel", "set_title", "set_xlabel",
    "set_ylabel", "set_zlabel", "set_xlim", "set_ylim", "set_xticks", "set_yticks",
    "set_xticklabels", "set_yticklabels", "set_xscale", "set_yscale", "set_aspect", "set",
    "grid", "tick_params", "add_patch", "add_artist", "add_collection", "add_line",
    "add_image", "add_table", "tight_layout", "set_size_inches", "set_facecolor",
    "spy", "specgram", "psd", "acorr", "xcorr", "eventplot", "broken_barh", "bar_label",
    "clabel", "tricontour", "tricontourf", "tripcolor", "triplot", "plot_surface",
    "plot_wireframe", "scatter3D", "plot3D", "margins", "autoscale", "invert_xaxis",
    "invert_yaxis", "axis", "set_axis_off", "label_outer", "heatmap",
})
PART_METHODS = frozenset({
    "add_subplot", "add_axes", "subplots", "subplot_mosaic", "gca", "twinx", "twiny",
    "inset_axes", "get_figure", "add_subfigure", "subfigures", "secondary_xaxis",
    "secondary_yaxis", "get_axes",
})
PANDAS_PLOT_METHODS = frozenset({"plot", "hist", "boxplot"})
SEABORN_FIGURE_LEVEL = frozenset({
    "relplot", "displot", "catplot", "lmplot", "pairplot", "jointplot", "clustermap",
    "FacetGrid", "PairGrid", "JointGrid",
})
SEABORN_NEUTRAL = frozenset({
    "set", "set_theme", "set_style", "set_context", "set_palette", "color_palette",
    "axes_style", "plotting_context", "reset_defaults", "reset_orig", "despine_none",
    "load_dataset", "get_dataset_names", "light_palette", "dark_palette", "diverging_palette",
    "cubehelix_palette", "blend_palette", "mpl_palette", "husl_palette", "hls_palette",
})

#: builtins that never mutate their arguments
PURE_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "complex",
    "dict", "dir", "divmod", "enumerate", "filter", "float", "format", "frozenset",
    "getattr", "hasattr", "hash", "hex", "id", "int", "isinstance", "issubclass", "iter",
    "len", "list", "map", "max", "min", "oct", "open", "ord", "pow", "print", "range", "repr",
    "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "type", "zip",
    "display", "Path", "PurePath",
})
#: modules whose functions do not mutate their arguments (except IMPURE_FUNCTIONS)
PURE_MODULES = frozenset({
    "math", "cmath", "statistics", "os.path", "posixpath", "pathlib", "json", "re", "string",
    "textwrap", "operator", "itertools", "functools", "glob", "fnmatch", "numpy", "np",
    "pandas", "pd", "scipy", "scipy.stats", "decimal", "fractions", "datetime", "time",
    "hashlib", "base64", "copy", "shlex", "csv", "pprint", "os", "shutil", "collections",
    "numpy.linalg", "numpy.random", "yaml", "pickle", "math.fsum", "struct", "sklearn",
    "torch", "polars", "pl", "logging", "warnings",
})
#: functions of PURE_MODULES that do mutate an argument (or write through a handle)
IMPURE_FUNCTIONS = frozenset({
    "random.shuffle", "numpy.random.shuffle", "numpy.copyto", "numpy.put", "numpy.place",
    "numpy.putmask", "numpy.fill_diagonal", "numpy.random.Generator.shuffle", "heapq.heappush",
    "heapq.heapify", "heapq.heappop", "heapq.heapreplace", "heapq.heappushpop", "bisect.insort",
    "json.dump", "pickle.dump", "yaml.dump", "csv.writer", "csv.DictWriter", "numpy.save",
    "numpy.savetxt", "numpy.savez", "operator.setitem", "operator.delitem", "operator.iadd",
    "collections.deque", "os.write", "shutil.copyfileobj", "torch.save",
})


#: decorators that keep a function's results between calls
CACHE_DECORATORS = frozenset({"cache", "lru_cache", "cached", "memoize", "memoized",
                              "cache_data", "cache_resource"})
#: methods that change their receiver (a dict, list, set or deque)
MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear",
    "remove", "discard", "appendleft", "extendleft", "put", "put_nowait", "__setitem__",
})
#: calls that open a path and read its bytes (beside names starting with read/load)
READ_CALLS = frozenset({
    "open", "imread", "genfromtxt", "fromfile", "memmap", "File", "connect", "loadmat",
    "ParquetFile", "parquet_file", "dataset", "open_dataset", "open_mfdataset", "Dataset",
    "ExcelFile", "HDFStore", "ZipFile", "TarFile", "urlopen",
})
#: calls given a path that do not read its bytes
PATH_ONLY_CALLS = frozenset({
    "symlink", "link", "exists", "isfile", "isdir", "islink", "lexists", "getsize",
    "getmtime", "getctime", "getatime", "stat", "lstat", "remove", "unlink", "rmdir",
    "removedirs", "mkdir", "makedirs", "chmod", "chown", "utime", "access", "touch",
    "samefile", "relpath", "commonpath", "is_file", "is_dir", "is_symlink", "rename",
    "replace", "print", "repr", "str", "len", "format", "abspath", "basename", "dirname",
    "split", "splitext", "join", "normpath", "realpath", "fspath", "Path", "PurePath",
    "info", "debug", "warning", "error", "critical", "log", "write", "display",
})


def reads_named_path(name: str) -> bool:
    """Whether a call named ``name`` (``open``, ``read_csv``) reads the file a path names."""
    if name in PATH_ONLY_CALLS:
        return False
    return name in READ_CALLS or name.startswith(("read", "load"))


def library_of(name: str, modules: Mapping[str, str]) -> str | None:
    """The dotted module a name was imported as, falling back to conventional aliases."""
    found = modules.get(name)
    if found is not None:
        return found
    return _CONVENTIONAL.get(name)


def is_pure(dotted: str) -> bool:
    """Whether a call to ``dotted`` (``len``, ``numpy.mean``, ``os.path.join``) leaves
    its arguments as they were."""
    canonical = dotted.replace("np.", "numpy.", 1) if dotted.startswith("np.") else dotted
    if canonical in IMPURE_FUNCTIONS or dotted in IMPURE_FUNCTIONS:
        return False
    if "." not in dotted:
        return dotted in PURE_BUILTINS
    module = canonical.rpartition(".")[0]
    while module:
        if module in PURE_MODULES:
            return True
        module = module.rpartition(".")[0]
    return False


def module_files_match(dotted: str, path: str) -> bool:
    """Whether workspace file ``path`` holds module ``dotted`` (``pkg.x`` is
    ``pkg/x.py`` or ``pkg/x/__init__.py``, found under any folder on ``sys.path``)."""
    if not dotted or not path.endswith(".py"):
        return False
    stem = dotted.replace(".", "/")
    for tail in (f"{stem}.py", f"{stem}/__init__.py"):
        if path == tail or path.endswith("/" + tail):
            return True
    return False
