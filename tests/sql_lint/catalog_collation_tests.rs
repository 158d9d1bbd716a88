//! R26 `catalog-collation`: a catalog name mixed with a registry, #temp or table-variable
//! column fires (naming both and the fix), and the fixed form, a catalog name with a literal,
//! a parameter, a catalog function's result or another catalog name, and a released file do
//! not.

use crate::{Rule, Violation, lint_bundle};

/// The registry as V2 declares it (no collate): released, so never checked itself.
const REGISTRY: (&str, &str) = (
    "V2__registry.sql",
    "create table changefeed.feeds (feed_id int not null, schema_name sysname not null,\n\
     table_name sysname not null, problem nvarchar(1000) null);\n",
);

/// A procedure around `body` (the body starts on line 5).
fn procedure(body: &str) -> String {
    format!(
        "create or alter procedure [changefeed].[p]\n    @name sysname = null\nas\nbegin\n\
         set nocount, xact_abort on;\n{body}\nend\n"
    )
}

/// R26's violations in a bundle of the registry and `files`.
fn r26(files: &[(&str, &str)]) -> Vec<Violation> {
    let files: Vec<(String, String)> = std::iter::once(&REGISTRY)
        .chain(files)
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    lint_bundle(&files)
        .into_iter()
        .filter(|v| v.rule == Rule::CatalogCollation)
        .collect()
}

/// R26 fires once, on `line` of `file`, naming `catalog` and `other`; returns its message.
#[track_caller]
fn assert_fires_once(files: &[(&str, &str)], file: &str, line: usize, catalog: &str, other: &str) {
    let found = r26(files);
    assert_eq!(
        found
            .iter()
            .map(|v| (v.file.as_str(), v.line))
            .collect::<Vec<_>>(),
        [(format!("sql/{file}").as_str(), line)],
        "{found:#?}"
    );
    let message = &found[0].message;
    for words in [
        format!("`{catalog}` is a catalog name"),
        format!("`{other}` is not"),
        format!("`{catalog} collate database_default`"),
        "Latin1_General_100_CI_AS_KS_WS_SC".to_owned(),
        "Msg 468".to_owned(),
    ] {
        assert!(message.contains(&words), "{words}: {message}");
    }
}

#[track_caller]
fn assert_clean(files: &[(&str, &str)]) {
    let found = r26(files);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_catalog_name_compared_with_a_registry_column_fires_unless_collated() {
    let join = procedure(
        "select f.feed_id\nfrom changefeed.feeds as f\ninner join sys.tables as t\n    \
         on t.name = f.table_name;",
    );
    assert_fires_once(
        &[("V60__p.sql", &join)],
        "V60__p.sql",
        9,
        "t.name",
        "f.table_name",
    );
    let fixed = join.replace("t.name =", "t.name collate database_default =");
    assert_clean(&[("V60__p.sql", &fixed)]);

    // `in`, `like`, a #temp column and a table variable's column fire too.
    let listed = procedure(
        "select 1 from changefeed.feeds as f\nwhere exists (select 1 from sys.columns as c\n\
         where c.name in (f.table_name, N'x'));",
    );
    assert_fires_once(
        &[("V60__p.sql", &listed)],
        "V60__p.sql",
        8,
        "c.name",
        "f.table_name",
    );
    let like = procedure(
        "select 1 from changefeed.feeds as f, sys.objects as o\nwhere o.name like f.table_name;",
    );
    assert_fires_once(
        &[("V60__p.sql", &like)],
        "V60__p.sql",
        7,
        "o.name",
        "f.table_name",
    );
    let temp = procedure(
        "select 1 from #keys as k\ninner join sys.columns as c\n    on c.name = k.column_name;",
    );
    assert_fires_once(
        &[("V60__p.sql", &temp)],
        "V60__p.sql",
        8,
        "c.name",
        "k.column_name",
    );
    let variable = procedure(
        "declare @keys table (column_name sysname);\n\
         select 1 from @keys as k\ninner join sys.columns as c\n    on k.column_name = c.name;",
    );
    assert_fires_once(
        &[("V60__p.sql", &variable)],
        "V60__p.sql",
        9,
        "c.name",
        "k.column_name",
    );
}

#[test]
fn a_catalog_name_with_literals_parameters_or_other_catalog_names_does_not_fire() {
    let body = procedure(
        "select c.name from sys.columns as c\n\
         inner join sys.tables as t on t.object_id = c.object_id and t.name = c.name\n\
         inner join changefeed.feeds as f on f.object_id = t.object_id\n\
         where c.name = N'ulid' and c.name <> @name and t.name in (N'a', @name)\n\
         and schema_name(t.schema_id) = f.schema_name and object_name(t.object_id) = f.table_name\n\
         and c.name in (select r.name from (values (N'id'), (N'status')) as r (name))\n\
         and len(c.name) + len(f.table_name) > 0;\n\
         select @name = N'[' + t.name + N'].' + quotename(c.name) from sys.columns as c\n\
         inner join sys.tables as t on t.object_id = c.object_id;",
    );
    assert_clean(&[("V60__p.sql", &body)]);
}

#[test]
fn a_concatenation_case_or_union_of_both_fires() {
    let concat = procedure(
        "select @name = N'column ' + quotename(c.name) + N' of ' + f.table_name\n\
         from changefeed.feeds as f\ninner join sys.columns as c on c.object_id = f.feed_id;",
    );
    assert_fires_once(
        &[("V60__p.sql", &concat)],
        "V60__p.sql",
        6,
        "c.name",
        "f.table_name",
    );
    let fixed = concat.replace(
        "quotename(c.name)",
        "quotename(c.name) collate database_default",
    );
    assert_clean(&[("V60__p.sql", &fixed)]);

    let case = procedure(
        "select case when f.problem is null\n then f.table_name else c.name end\n\
         from changefeed.feeds as f\ninner join sys.columns as c on c.object_id = f.feed_id;",
    );
    assert_fires_once(
        &[("V60__p.sql", &case)],
        "V60__p.sql",
        6,
        "c.name",
        "f.table_name",
    );
    assert_clean(&[(
        "V60__p.sql",
        &case.replace(
            "else c.name end",
            "else c.name collate database_default end",
        ),
    )]);

    let union = procedure(
        "select f.table_name from changefeed.feeds as f\nunion all\n\
         select o.name from sys.objects as o;",
    );
    assert_fires_once(
        &[("V60__p.sql", &union)],
        "V60__p.sql",
        7,
        "o.name",
        "f.table_name",
    );
}

/// A function that builds a text from catalog names, as feed_key_problem does.
const PROBLEM_FUNCTION: &str = "create or alter function [changefeed].[key_problem] (@id int)\n\
     returns table\nas\nreturn\nwith current_key as (\n\
     select c.name from sys.columns as c where c.object_id = @id\n)\n\
     select convert(nvarchar(1000), N'key column ' + quotename(k.name) + N' changed')\n\
     as problem\nfrom current_key as k;\n";

#[test]
fn a_catalog_name_returned_by_a_function_fires_where_it_meets_a_registry_column() {
    // refresh_feed_status's statement: the function's problem in a case with registry names,
    // compared with the registry's problem.
    let caller = procedure(
        "update f set problem = p.problem\nfrom changefeed.feeds as f\n\
         outer apply changefeed.key_problem(f.feed_id) as k\n\
         cross apply (select case when k.problem is not null then k.problem\n\
         else N'table ' + f.table_name end as problem) as p\n\
         where isnull(f.problem, N'') <> isnull(p.problem, N'');",
    );
    let found = r26(&[("V60__f.sql", PROBLEM_FUNCTION), ("V61__p.sql", &caller)]);
    assert_eq!(
        found.iter().map(|v| v.line).collect::<Vec<_>>(),
        [9, 11],
        "{found:#?}"
    );
    assert!(
        found.iter().all(|v| v.file == "sql/V61__p.sql"
            && v.message
                .contains("changefeed.key_problem (sql/V60__f.sql)")),
        "{found:#?}"
    );

    // Fixed where the text is built: the function returns it in the database's collation.
    let fixed = PROBLEM_FUNCTION.replace("\nas problem", " collate database_default\nas problem");
    assert_clean(&[("V60__f.sql", &fixed), ("V61__p.sql", &caller)]);
    // A caller created while the function was the old one failed then, even if a later
    // file fixes the function.
    assert_eq!(
        r26(&[
            ("V60__f.sql", PROBLEM_FUNCTION),
            ("V61__p.sql", &caller),
            ("V62__f.sql", &fixed),
        ])
        .len(),
        2
    );
}

#[test]
fn released_migrations_are_exempt_from_catalog_collation() {
    let join = procedure(
        "select 1 from changefeed.feeds as f\ninner join sys.tables as t on t.name = f.table_name;",
    );
    assert_clean(&[("V3__p.sql", &join)]);
    assert_eq!(r26(&[("V50__p.sql", &join)]).len(), 1);
}
