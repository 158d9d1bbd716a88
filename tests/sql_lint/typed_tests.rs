//! R11–R19: each rule rejects a minimal bad example (naming file, line, rule and fix) and
//! accepts the fixed form.

use crate::typed::ACCEPT_VIEW_READPAST;
use crate::{
    F, Rule, Schema, assert_clean, assert_fires, assert_fires_saying, lint_file, lint_file_in,
};

/// A procedure around `body` (the body starts on line 5).
fn procedure(body: &str) -> String {
    format!(
        "create or alter procedure [changefeed].[p]\n    @n bigint = 0\nas\nbegin\n{body}\n\
         end\n"
    )
}

/// R12 fires on line `line` of `src`, and `src` with `mixed` made `fixed` is clean.
fn assert_collation_fix(src: &str, line: usize, mixed: &str, fixed: &str) {
    assert_fires(src, Rule::CollationMix, line);
    assert_clean(&src.replace(mixed, fixed));
}

const PREAMBLE: &str = "set nocount, xact_abort on;";

// R11 int-literal-range

#[test]
fn integer_literal_beyond_int_fires() {
    let bad = procedure(&format!(
        "{PREAMBLE} if @n > 31622400000 throw 51000, N'too big: 31622400000', 1;"
    ));
    let message = assert_fires(&bad, Rule::IntLiteral, 5);
    assert!(
        message.contains("convert(bigint, 31622400000)"),
        "{message}"
    );
    assert!(message.contains("numeric"), "{message}");
    assert_fires("select 2147483648;", Rule::IntLiteral, 1);
    assert_fires("select @n + 100000000000;", Rule::IntLiteral, 1);
    assert_fires("select -2147483649;", Rule::IntLiteral, 1);

    // The fixed forms: a typed operand, a bigint variable or parameter, a literal in a
    // string, and every literal within the int range.
    assert_clean(&procedure(&format!(
        "{PREAMBLE} if @n > convert(bigint, 31622400000) throw 51000, N'31622400000', 1;"
    )));
    assert_clean(
        "declare @max bigint = 31622400000, @mask bigint = -4611686018427387905;\n\
         select cast(3155760000000 as bigint), convert(bigint, -4611686018427387905), \
         2147483647, -2147483647, 0x7FFFFFFFFFFFFFFF;",
    );
    assert_clean(
        "create or alter procedure p @older_than_ms as bigint = 7776000000 as begin \
         set nocount, xact_abort on; end",
    );
}

// R19 bitwise-operand

/// The statement SQL Server refused in V15 and V42 (Msg 402).
const NUMERIC_MASK: &str =
    "set @counter_start\n    = convert(bigint, crypt_gen_random(8)) & -4611686018427387905;";

#[test]
fn bitwise_operator_with_a_numeric_operand_fires() {
    let src = format!("declare @counter_start bigint;\n{NUMERIC_MASK}");
    let message = assert_fires(&src, Rule::BitwiseOperand, 3);
    assert!(message.contains("Msg 402"), "{message}");
    assert!(message.contains("convert(bigint, …)"), "{message}");
    assert_fires(&src, Rule::IntLiteral, 3);
    assert_fires(
        "declare @d decimal(20, 0) = 1, @b bigint = 7;\nselect @b | @d;",
        Rule::BitwiseOperand,
        2,
    );
    assert_fires("select 5 & 1.0;", Rule::BitwiseOperand, 1);
    assert_fires(
        "select convert(numeric(20, 0), 3) ^ 1;",
        Rule::BitwiseOperand,
        1,
    );
    assert_fires("select 0x01 & 0x03;", Rule::BitwiseOperand, 1);

    assert_clean(
        "declare @mask bigint = -4611686018427387905, @counter_start bigint;\n\
         set @counter_start = convert(bigint, crypt_gen_random(8)) & @mask;\n\
         set @counter_start = convert(bigint, crypt_gen_random(8)) \
         & convert(bigint, -4611686018427387905);\n\
         select 0x01 & 3, @counter_start | 1, 6 ^ 3;",
    );
}

// R12 collation-mix

/// The outbox DDL as create_outbox_storage builds it (dynamic SQL, as in V27).
const OUTBOX_DDL: &str = "declare @sql nvarchar(max) = N'create table t (id bigint, '\n\
    + N'aggregate_id nvarchar(256) collate Latin1_General_100_BIN2 null, '\n\
    + N'partition_key nvarchar(256) null);';\n";

#[test]
fn coalesce_of_two_collations_fires() {
    // The statement SQL Server refused in V30 (Msg 457), against the DDL it binds to.
    let src = format!(
        "{OUTBOX_DDL}update t set partition_key = null\noutput\n    \
         coalesce(inserted.partition_key, inserted.aggregate_id) into @x (k);"
    );
    let message = assert_fires(&src, Rule::CollationMix, 6);
    assert!(message.contains("inserted.aggregate_id"), "{message}");
    assert!(
        message.contains("Latin1_General_100_BIN2` at V1__test.sql:2"),
        "{message}"
    );
    assert!(message.contains("`inserted.partition_key`"), "{message}");
    assert!(message.contains("collate"), "{message}");

    let fixed = src.replace(
        "inserted.aggregate_id)",
        "inserted.aggregate_id collate Latin1_General_100_BIN2)",
    );
    assert_clean(&fixed);
    // Or both columns declared with the same collation.
    let same = src.replace(
        "partition_key nvarchar(256) null",
        "partition_key nvarchar(256) collate Latin1_General_100_BIN2 null",
    );
    assert_clean(&same);
}

#[test]
fn the_collation_of_a_column_comes_from_the_whole_bundle() {
    // The column is declared in another file: only the bundle's schema knows it.
    let statement = "select isnull(o.partition_key, o.aggregate_id) from t as o;";
    assert_clean(statement);
    let mut schema = Schema::of("sql/V27__x.sql", OUTBOX_DDL);
    schema.add(F, statement);
    let violations = lint_file_in(F, statement, &schema);
    assert!(
        violations
            .iter()
            .any(|v| v.rule == Rule::CollationMix && v.message.contains("sql/V27__x.sql:2")),
        "{violations:?}"
    );
}

#[test]
fn comparison_case_iif_and_union_of_two_collations_fire() {
    let compare =
        format!("{OUTBOX_DDL}select 1 from t as a\nwhere a.aggregate_id = a.partition_key;");
    assert_collation_fix(
        &compare,
        5,
        "= a.partition_key",
        "= a.partition_key collate Latin1_General_100_BIN2",
    );

    let temp = format!(
        "{OUTBOX_DDL}select 1 from t as a\njoin #keys as k on k.id = a.id\n\
                        where k.name <> a.aggregate_id;"
    );
    assert_collation_fix(&temp, 6, "k.name <>", "k.name collate database_default <>");

    let case = format!(
        "{OUTBOX_DDL}select case when id > 0\n then aggregate_id else partition_key end from t;"
    );
    assert_collation_fix(
        &case,
        4,
        "then aggregate_id",
        "then aggregate_id collate database_default",
    );

    let iif = format!("{OUTBOX_DDL}select iif(id > 0, aggregate_id, partition_key) from t;");
    assert_fires(&iif, Rule::CollationMix, 4);

    let union =
        format!("{OUTBOX_DDL}select aggregate_id from t\nunion all\nselect partition_key from t;");
    assert_collation_fix(
        &union,
        5,
        "select partition_key",
        "select partition_key collate Latin1_General_100_BIN2",
    );

    let table_variable = format!(
        "{OUTBOX_DDL}declare @c table (aggregate_id nvarchar(256));\n\
         select 1 from t as o join @c as c\n  on c.aggregate_id = o.aggregate_id;"
    );
    assert_fires(&table_variable, Rule::CollationMix, 6);
    // A table variable declares its own collation; one of a table type has the type's.
    assert_clean(&table_variable.replace(
        "@c table (aggregate_id nvarchar(256))",
        "@c table (aggregate_id nvarchar(256) collate Latin1_General_100_BIN2)",
    ));
    assert_clean(&table_variable.replace(
        "@c table (aggregate_id nvarchar(256))",
        "@c [changefeed].[type:read:dbo.t]",
    ));

    // One collation, parameters and variables (coercible), and assignments are fine.
    assert_clean(&format!(
        "{OUTBOX_DDL}select 1 from t as e join t as l on l.aggregate_id = e.aggregate_id\n\
         where e.aggregate_id = @aggregate_id and coalesce(e.aggregate_id, N'') <> N'';\n\
         update t set partition_key = aggregate_id;"
    ));
}

// R13 implicit-transactions

#[test]
fn own_transaction_without_implicit_transactions_off_fires() {
    let body = "begin try\n    begin transaction;\n    commit transaction;\nend try\n\
                begin catch\n    if @@trancount > 0 rollback transaction;\n    throw;\n\
                end catch;";
    let bad = procedure(&format!("{PREAMBLE}\n{body}"));
    let message = assert_fires(&bad, Rule::ImplicitTransactions, 7);
    assert!(
        message.contains("set implicit_transactions off;"),
        "{message}"
    );
    // Set after the transaction began: too late.
    let late = procedure(&format!(
        "{PREAMBLE}\n{}",
        body.replace(
            "commit transaction;",
            "set implicit_transactions off; commit transaction;"
        )
    ));
    assert_fires(&late, Rule::ImplicitTransactions, 7);

    assert_clean(&procedure(&format!(
        "{PREAMBLE}\nset implicit_transactions off;\n{body}"
    )));
    // A procedure that only requires the caller's transaction opens none.
    assert_clean(&procedure(&format!(
        "{PREAMBLE}\nif @@trancount = 0 throw 51200, N'begin a transaction first', 1;"
    )));
}

// R14 silent-truncation

#[test]
fn isnull_that_cuts_its_second_argument_fires() {
    let bad = "declare @short nvarchar(10) = N'abc', @long nvarchar(200) = N'x';\n\
               select isnull(@short, @long);";
    assert_fires_saying(bad, Rule::Truncation, 2, "coalesce");
    assert_fires(
        "declare @id nvarchar(4) = null;\nselect isnull(@id, convert(nvarchar(64), newid()));",
        Rule::Truncation,
        2,
    );
    assert_fires(
        "create table t (k varchar(5));\nselect isnull(k, 'a longer default') from t;",
        Rule::Truncation,
        2,
    );
    assert_clean(
        "declare @short nvarchar(10) = N'abc', @long nvarchar(200) = N'x';\n\
         select coalesce(@short, @long), isnull(@long, @short), isnull(@short, N'(null)'), \
         isnull(@x, @long);",
    );
}

#[test]
fn declared_value_longer_than_its_variable_fires() {
    let bad = "declare @shard_id int = 0;\n\
               declare @resource nvarchar(20) = concat(N'changefeed:read_feed:', @shard_id);";
    assert_fires_saying(bad, Rule::Truncation, 2, "nvarchar(20)");
    assert_fires("declare @k sysname = N'", Rule::Lexical, 1);
    let long_name = "x".repeat(129);
    assert_fires(
        &format!("declare @k sysname = N'{long_name}';"),
        Rule::Truncation,
        1,
    );
    assert_clean(
        "declare @shard_id int = 0;\n\
         declare @resource nvarchar(255) = concat(N'changefeed:read_feed:', @shard_id);",
    );
}

// R15 cursor-parameter

#[test]
fn binary_cursor_parameter_fires() {
    let bad = "create or alter procedure p\n    @shard_id int,\n    @cursor binary(16)\nas\n\
               begin\n    set nocount, xact_abort on;\nend";
    assert_fires_saying(bad, Rule::CursorParameter, 3, "datalength(@cursor) <> 16");
    assert_clean(&bad.replace("binary(16)", "varbinary(17)"));
    assert_clean(&bad.replace("binary(16)", "binary(16) output"));
}

// R16 view-readpast

#[test]
fn readpast_in_a_view_fires() {
    let bad = "create or alter view v\nas\nselect count(*) as n\nfrom t with (readcommittedlock, readpast);";
    assert_fires_saying(bad, Rule::ViewReadpast, 4, "650");
    assert_clean(&bad.replace(", readpast", ""));
    // A view may accept the rule only with a stated reason.
    assert_clean(&format!(
        "{ACCEPT_VIEW_READPAST} documented in README\n{bad}"
    ));
    assert_fires(
        &format!("{ACCEPT_VIEW_READPAST}\n{bad}"),
        Rule::ViewReadpast,
        5,
    );
    // In a procedure, which can set its isolation level, READPAST is fine.
    assert_clean(
        "create or alter procedure p as begin set nocount, xact_abort on;\n\
         set transaction isolation level read committed;\n\
         select 1 from t with (readcommittedlock, readpast, rowlock); end",
    );
}

// R17 session-context-type

#[test]
fn session_context_without_convert_fires() {
    let bad = "select 1\nwhere session_context(N'k') = 0x01;";
    assert_fires_saying(bad, Rule::SessionContext, 2, "sql_variant");
    assert_clean(
        "select 1 where convert(varbinary(24), session_context(N'k')) = 0x01\n\
         and cast(session_context(N'n') as bigint) = 1;",
    );
}

// R18 function-side-effects

#[test]
fn side_effects_in_a_function_fire() {
    let bad = "create or alter function f ()\nreturns bigint\nas\nbegin\n\
               return convert(bigint, crypt_gen_random(8));\nend";
    assert_fires_saying(bad, Rule::FunctionSideEffects, 5, "parameter");
    assert_fires(
        "create or alter function f (@i int)\nreturns int\nas\nbegin\n\
         if @i is null throw 51000, N'x', 1;\nreturn @i;\nend",
        Rule::FunctionSideEffects,
        5,
    );
    assert_clean(
        "create or alter function f (@random binary(8))\nreturns bigint\nas\nbegin\n\
         return convert(bigint, @random);\nend",
    );
    // A procedure may.
    assert_clean(
        "create or alter procedure p as begin set nocount, xact_abort on;\n\
         select newid(), crypt_gen_random(8); end",
    );
}

#[test]
fn typed_rules_read_no_comments_or_strings() {
    let src = "-- 31622400000 & 1.5, readpast, session_context(N'k')\n\
               select N'coalesce(inserted.partition_key, inserted.aggregate_id) & 3155760000000';";
    assert!(lint_file(F, src).is_empty());
}
