"""Def/use names of a cell: what it binds, reads, deletes and mutates."""

from __future__ import annotations

from host_kernel.lineage.defuse import CellNames, FunctionNames, cell_names


def names(code: str) -> CellNames:
    return cell_names(code)


# -- definitions -----------------------------------------------------------------


def test_simple_assignment_defines_the_target() -> None:
    result = names("x = 1")
    assert result.defined == {"x"}
    assert result.used == set()


def test_tuple_unpacking_and_starred_targets_are_defined() -> None:
    assert names("a, (b, *c) = f()").defined == {"a", "b", "c"}


def test_chained_assignment_defines_every_target() -> None:
    assert names("a = b = 0").defined == {"a", "b"}


def test_augmented_assignment_defines_and_uses() -> None:
    result = names("total += step")
    assert result.defined == {"total"}
    assert result.used == {"total", "step"}


def test_annotated_assignment_with_value_defines() -> None:
    assert names("x: int = y").defined == {"x"}


def test_bare_annotation_binds_nothing() -> None:
    result = names("x: int")
    assert result.defined == set()
    assert result.used == set()


def test_for_target_is_defined() -> None:
    assert names("for row in rows:\n    pass").defined == {"row"}


def test_with_as_target_is_defined() -> None:
    result = names("with open(p) as fh:\n    text = fh.read()")
    assert result.defined == {"fh", "text"}
    assert result.used == {"p"}


def test_except_as_name_is_defined() -> None:
    assert "err" in names("try:\n    f()\nexcept ValueError as err:\n    pass").defined


def test_import_binds_the_top_package() -> None:
    result = names("import os.path")
    assert result.defined == {"os"}
    assert result.imported == {"os"}


def test_function_defined_in_both_branches_merges_its_reads() -> None:
    code = "if fast:\n    def f():\n        return a\nelse:\n    def f():\n        return b"
    function = names(code).function("f")
    assert function is not None
    assert function.when_called == {"a", "b"}


def test_a_name_bound_by_def_and_by_assignment_is_not_a_function() -> None:
    assert names("def f():\n    pass\nf = wrap(f)").functions == ()


def test_import_as_and_from_import_bind_their_names() -> None:
    result = names("import numpy as np\nfrom json import load, dumps as dump")
    assert result.defined == {"np", "load", "dump"}
    assert result.imported == {"np", "load", "dump"}


def test_star_import_binds_nothing_known() -> None:
    assert names("from math import *").defined == set()


def test_function_and_class_definitions_define_their_names() -> None:
    result = names("def f():\n    pass\nclass C:\n    pass")
    assert result.defined == {"f", "C"}
    assert result.functions == (FunctionNames("C", is_class=True), FunctionNames("f"))


def test_global_assigned_inside_a_function_is_defined() -> None:
    result = names("def setup():\n    global config\n    config = load()")
    assert result.defined == {"setup", "config"}


def test_function_locals_are_not_defined() -> None:
    assert names("def f(a):\n    b = a\n    return b").defined == {"f"}


def test_walrus_at_top_level_is_defined() -> None:
    result = names("if (m := match(text)):\n    print(m)")
    assert "m" in result.defined
    assert "m" not in result.used


def test_walrus_in_a_comprehension_binds_at_module_level() -> None:
    result = names("[last := v for v in values]")
    assert result.defined == {"last"}
    assert result.used == {"values"}


def test_comprehension_variables_do_not_leak() -> None:
    result = names("squares = [v * v for v in values if v > limit]")
    assert result.defined == {"squares"}
    assert result.used == {"values", "limit"}


def test_match_captures_are_defined() -> None:
    code = ("match point:\n    case (x, *rest):\n        pass\n"
            "    case {'k': v, **others}:\n        pass")
    assert names(code).defined == {"x", "rest", "v", "others"}


# -- uses ------------------------------------------------------------------------


def test_names_read_before_binding_are_used() -> None:
    result = names("y = x + 1")
    assert result.used == {"x"}


def test_a_name_bound_earlier_in_the_cell_is_not_used() -> None:
    result = names("x = load()\ny = x + 1")
    assert result.used == {"load"}


def test_reading_before_rebinding_in_the_same_statement_is_a_use() -> None:
    assert names("x = x + 1").used == {"x"}


def test_binding_inside_a_branch_is_not_certain() -> None:
    assert "a" in names("if c:\n    a = 1\nprint(a)").used


def test_binding_on_both_sides_of_an_if_is_certain() -> None:
    assert "a" not in names("if c:\n    a = 1\nelse:\n    a = 2\nprint(a)").used


def test_loop_carried_reads_are_uses() -> None:
    result = names("for v in values:\n    total = total + v")
    assert result.used == {"values", "total"}


def test_with_body_bindings_are_certain_afterwards() -> None:
    result = names("with open(p) as fh:\n    data = fh.read()\nresult = clean(data)")
    assert result.used == {"p", "clean"}


def test_free_names_of_a_function_are_used() -> None:
    result = names("def scale(v):\n    return v * factor\n")
    assert result.used == {"factor"}
    assert result.function("scale") == FunctionNames("scale", when_called=frozenset({"factor"}))


def test_defaults_and_decorators_are_read_where_defined() -> None:
    result = names("@register(kind)\ndef f(a=default) -> Out:\n    return a + b")
    assert result.used == {"register", "kind", "default", "Out", "b"}
    function = result.function("f")
    assert function is not None
    assert function.when_defined == {"register", "kind", "default", "Out"}
    assert function.when_called == {"b"}


def test_lambda_free_names_are_used() -> None:
    result = names("key = lambda row: row[column]")
    assert result.used == {"column"}
    assert result.functions == ()


def test_nonlocal_names_resolve_in_the_enclosing_function() -> None:
    code = ("def outer():\n    n = 0\n    def inner():\n        nonlocal n\n"
            "        n += step\n    return inner")
    assert names(code).used == {"step"}


def test_class_body_reads_are_used_and_methods_skip_class_names() -> None:
    code = "class Model(Base):\n    size = 3\n    def fit(self):\n        return size + data"
    result = names(code)
    assert result.used == {"Base", "size", "data"}
    model = result.function("Model")
    assert model is not None
    assert model.when_defined == {"Base", "size", "data"}
    assert model.when_called == {"size", "data"}


def test_builtins_are_not_used_but_listed_apart() -> None:
    result = names("n = len(rows)\nprint(n)")
    assert result.used == {"rows"}
    assert result.builtins_used == {"len", "print"}


def test_a_shadowed_builtin_bound_in_the_cell_is_not_listed() -> None:
    result = names("max = 3\nprint(max)")
    assert result.builtins_used == {"print"}


def test_attribute_and_subscript_reads_use_the_base_name() -> None:
    assert names("v = cfg.section['key']").used == {"cfg"}


# -- deletion --------------------------------------------------------------------


def test_del_records_the_name_as_deleted() -> None:
    result = names("del frame")
    assert result.deleted == {"frame"}
    assert result.defined == set()


def test_defined_then_deleted_is_only_deleted() -> None:
    result = names("tmp = 1\ndel tmp")
    assert result.deleted == {"tmp"}
    assert result.defined == set()


def test_deleted_then_rebound_is_only_defined() -> None:
    result = names("del x\nx = 2")
    assert result.defined == {"x"}
    assert result.deleted == set()


def test_conditional_del_is_not_a_deletion() -> None:
    assert names("if c:\n    del x").deleted == set()


# -- mutation --------------------------------------------------------------------


def test_method_call_statement_mutates_the_receiver() -> None:
    result = names("rows.append(x)")
    assert result.mutated == {"rows"}
    assert result.used == {"x"}  # putting a value in reads nothing of what rows holds
    assert result.defined == set()
    assert names("rows.sort(key=x)").used == {"rows", "x"}


def test_method_call_used_for_its_value_is_not_a_mutation() -> None:
    assert names("n = df.count()").mutated == set()


def test_awaited_method_call_statement_mutates_the_receiver() -> None:
    assert names("await queue.put(item)").mutated == {"queue"}


def test_subscript_assignment_mutates() -> None:
    assert names("table[0] = value").mutated == {"table"}


def test_attribute_assignment_mutates_the_base_name() -> None:
    assert names("model.config.depth = 3").mutated == {"model"}


def test_augmented_subscript_assignment_mutates() -> None:
    assert names("counts[key] += 1").mutated == {"counts"}


def test_del_of_an_item_mutates_not_deletes() -> None:
    result = names("del cache['k']")
    assert result.mutated == {"cache"}
    assert result.deleted == set()


def test_inplace_true_mutates_the_receiver() -> None:
    assert names("out = df.dropna(inplace=True)").mutated == {"df"}


def test_method_chain_through_a_call_mutates_nothing() -> None:
    assert names("make().append(1)").mutated == set()


def test_mutation_inside_a_loop_body_is_seen() -> None:
    assert names("for r in reader:\n    rows.append(r)").mutated == {"rows"}


def test_mutation_inside_a_function_body_is_not_seen() -> None:
    assert names("def add(r):\n    rows.append(r)").mutated == set()


# -- IPython syntax and bad input ------------------------------------------------


def test_line_magic_alone_is_ignored() -> None:
    result = names("%matplotlib inline\nx = 1")
    assert result.defined == {"x"}
    assert not result.parse_error


def test_time_magic_analyses_the_timed_statement() -> None:
    result = names("%time x = f(y)")
    assert result.defined == {"x"}
    assert result.used == {"f", "y"}


def test_timeit_options_are_skipped() -> None:
    assert names("%timeit -n 10 -r3 f(y)").used == {"f", "y"}


def test_shell_escape_is_ignored() -> None:
    result = names("!ls -la\ny = 2")
    assert result.defined == {"y"}
    assert not result.parse_error


def test_assignment_from_a_shell_escape_or_magic_defines_the_target() -> None:
    assert names("files = !ls\nenv = %env").defined == {"files", "env"}


def test_help_syntax_is_ignored() -> None:
    result = names("obj?\nlen??\n?print\nz = 0")
    assert result.defined == {"z"}
    assert not result.parse_error


def test_indented_magic_keeps_the_block_valid() -> None:
    result = names("for i in range(2):\n    %time v = g(i)")
    assert result.defined == {"i", "v"}
    assert result.used == {"g"}


def test_non_python_cell_magic_has_no_names() -> None:
    result = names("%%bash\nfor f in *.csv; do echo $f; done")
    assert result == CellNames()


def test_writefile_cell_magic_has_no_names() -> None:
    assert names("%%writefile script.py\nx = 1\n") == CellNames()


def test_timing_cell_magic_analyses_the_body() -> None:
    result = names("%%time\ntotal = sum(values)")
    assert result.defined == {"total"}
    assert result.used == {"values"}


def test_capture_cell_magic_binds_its_variable() -> None:
    result = names("%%capture output --no-stderr\nprint(x)")
    assert result.defined == {"output"}
    assert result.used == {"x"}


def test_top_level_await_parses() -> None:
    result = names("data = await fetch(url)")
    assert result.defined == {"data"}
    assert result.used == {"fetch", "url"}


def test_syntax_error_sets_parse_error_with_empty_sets() -> None:
    result = names("def broken(:\n")
    assert result.parse_error
    assert result.defined == set() and result.used == set()


def test_null_bytes_are_a_parse_error_not_a_crash() -> None:
    assert names("x = 1\x00").parse_error


def test_deep_nesting_is_a_parse_error_not_a_crash() -> None:
    assert names("x = " + "(" * 5000 + "1" + ")" * 5000).parse_error


def test_invalid_escape_warning_does_not_escape() -> None:
    # pytest turns warnings into errors here; the parse must stay silent
    assert names("pattern = '\\d+'").defined == {"pattern"}


def test_empty_cell_has_no_names() -> None:
    assert names("") == CellNames()
    assert names("# only a comment\n") == CellNames()


def test_class_and_function_definitions_are_told_apart() -> None:
    result = names("class A:\n    pass\ndef b():\n    pass")
    a, b = result.functions
    assert (a.name, a.is_class) == ("A", True)
    assert (b.name, b.is_class) == ("b", False)


# -- call effects: figures, mutation through arguments, links ------------------------

CURRENT = "<current figure>"
UNKNOWN = "<unknown names>"


def test_subplots_links_the_figure_its_axes_and_the_current_figure() -> None:
    result = names("fig, ax = plt.subplots()")
    assert result.links == (frozenset({"fig", "ax", CURRENT}),)
    assert CURRENT in result.defined


def test_add_subplot_links_the_axes_to_its_figure() -> None:
    assert frozenset({"ax", "fig"}) in names("ax = fig.add_subplot()").links


def test_drawing_methods_mutate_the_axes_even_inside_an_assignment() -> None:
    assert names("line, = ax.plot(x)").mutated >= {"ax"}
    assert names("axes[0].bar(x, y)").mutated >= {"axes"}
    assert names("im = ax.imshow(a)").links == (frozenset({"im", "ax"}),)


def test_pyplot_drawing_mutates_the_current_figure() -> None:
    for code in ("plt.plot(x)", "plt.hist(x)", "plt.scatter(x, y)", "plt.imshow(a)",
                 "df.plot()", "s.plot.bar()", "sns.histplot(df)"):
        assert CURRENT in names(code).mutated, code


def test_savefig_uses_the_current_figure_unless_a_new_one_was_started() -> None:
    assert CURRENT in names("plt.savefig('f.png')").used
    assert CURRENT not in names("plt.figure()\nplt.savefig('f.png')").used


def test_close_deletes_the_current_figure() -> None:
    assert CURRENT in names("plt.close()").deleted
    assert CURRENT in names("plt.clf()\nplt.plot(x)").defined


def test_seaborn_with_ax_draws_into_that_axes() -> None:
    result = names("sns.lineplot(data=df, ax=ax)")
    assert "ax" in result.mutated
    assert CURRENT not in result.mutated


def test_pyplot_alias_is_known_from_an_earlier_import() -> None:
    assert CURRENT in cell_names("p.plot(x)", modules={"p": "matplotlib.pyplot"}).mutated


def test_an_argument_of_a_call_not_known_pure_may_be_mutated() -> None:
    assert names("fill(rows, data)").mutated == {"rows", "data"}
    assert names("random.shuffle(x)").mutated >= {"x"}


def test_arguments_of_known_pure_calls_are_not_mutated() -> None:
    for code in ("n = len(rows)", "print(rows)", "s = json.dumps(rows)", "m = np.mean(rows)",
                 "p = os.path.join(d, 'x')", "y = math.sqrt(rows)", "z = sorted(rows)"):
        assert names(code).mutated == set(), code


def test_method_arguments_are_not_mutated() -> None:
    assert names("m = a.merge(b)").mutated == set()


def test_star_import_and_run_without_the_script_bind_unknown_names() -> None:
    assert UNKNOWN in names("from helpers import *").mutated
    assert UNKNOWN in names("%run script.py").mutated


def test_imports_list_the_dotted_modules() -> None:
    result = names("import pkg.x as m\nfrom helpers import f\nimport a.b")
    assert set(result.imports) == {("m", "pkg.x", "pkg.x"), ("f", "helpers.f", "helpers.f"),
                                   ("a", "a", "a.b")}


# -- containers at known keys ------------------------------------------------------


def test_a_literal_subscript_and_get_read_a_name_at_those_keys_only() -> None:
    result = names("keep = pd.concat([d['oslo'], d.get('bergen'), e[0]])")
    assert result.key_uses == {"d": (frozenset({"'oslo'", "'bergen'"}), False),
                               "e": (frozenset({"0"}), False)}


def test_any_other_load_reads_the_whole_name() -> None:
    for code in ("x = d[k]", "x = d['a'] + len(d)", "f(d)", "x = [v for v in d.values()]",
                 "def f():\n    return d['a']"):
        assert "d" not in names(code).key_uses, code
        assert "d" in names(code).used, code


def test_a_comprehension_filtered_by_key_reads_those_keys() -> None:
    assert names("t = {k: v for k, v in d.items() if k in ('a', 'b')}").key_uses == {
        "d": (frozenset({"'a'", "'b'"}), False)}
    assert names("t = [d[k] for k in ('a', 'b')]").key_uses == {
        "d": (frozenset({"'a'", "'b'"}), False)}
    assert names("t = {k: d[k] for k in d if k != 'c'}").key_uses == {
        "d": (frozenset({"'c'"}), True)}


def test_a_name_only_stored_into_is_mutated_not_used() -> None:
    result = names("d[name] = pd.read_csv(name)")
    assert result.mutated == {"d"}
    assert result.used == {"name", "pd"}
    assert result.key_store is None


def test_one_store_at_a_literal_key_is_a_key_store() -> None:
    assert names("d['oslo'] = f(x)").key_store == ("d", "'oslo'", True)
    assert names("(names,)\nd[3] = f(x)").key_store == ("d", "3", True)  # a loop's control
    assert names("del d['a']").key_store == ("d", "'a'", True)
    for code in ("d['a'] += 1", "d['a']['b'] = 1", "d['a'].append(1)", "d['a'].x = 1",
                 "d['a'].to_csv(p)"):
        assert names(code).key_store == ("d", "'a'", False), code
    for code in ("d['a'] = 1; x = 2", "d[k] = 1", "d.append(1)", "f(d['a'])", "o.d['a'] = 1"):
        assert names(code).key_store is None, code


def test_fresh_dicts_are_listed() -> None:
    assert names("a = {}\nb = dict()\nc = {k: 1 for k in x}\nl = []").dicts == {"a", "b", "c"}


# -- functions with state ----------------------------------------------------------


def test_a_cached_function_changes_itself_when_called() -> None:
    for decorator in ("functools.lru_cache(maxsize=None)", "functools.cache", "lru_cache"):
        function = names(f"@{decorator}\ndef load(p):\n    return open(p).read()").function(
            "load")
        assert function is not None and function.changes == {"load"}, decorator


def test_a_function_filling_a_module_dict_changes_it_when_called() -> None:
    function = names("def remember(p):\n    if p not in _seen:\n"
                     "        _seen[p] = open(p).read()\n    out.append(p)\n"
                     "    local = {}\n    local['x'] = 1\n    return _seen[p]").function("remember")
    assert function is not None and function.changes == {"_seen", "out"}
    assert not function.makes_state


def test_a_function_building_a_closure_with_state_makes_state() -> None:
    function = names("def memoised():\n    memo = {}\n    def get(p):\n"
                     "        return memo.setdefault(p, open(p).read())\n    return get"
                     ).function("memoised")
    assert function is not None and function.makes_state and function.changes == set()


def test_a_method_chained_on_a_changing_method_changes_the_root() -> None:
    assert names("groups.setdefault(k, []).append(row)").mutated == {"groups"}
    assert names("df.head().to_csv(p)").mutated == set()
