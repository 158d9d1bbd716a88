-- (Replaces V51's.) What is wrong with a feed's event table that makes its code fail:
-- one row with the problem (what changed, and the statement that fixes it), or no row when
-- nothing is. refresh_feed_status records it as the feed's problem (so upgrade_all_feeds
-- skips and reports the feed) and upgrade_feed refuses with it (51014). What changed: the
-- event table's owner is checked too (changefeed.owner_chain_problem, after the key).
--
-- The key. The feed's outbox, feed table and read type carry copies of the key columns,
-- made by create_feed_storage when the feed was set up, and every generated procedure names
-- them. When the event table's key changes afterwards (a key column renamed, added, dropped
-- or retyped, or the primary key dropped), the storage still holds the old key, and
-- regenerating the feed's code fails to compile (Msg 207, invalid column name). Under
-- SET XACT_ABORT ON such an error dooms the whole transaction (XACT_STATE() = -1: it can
-- neither commit nor roll back to a savepoint), so upgrade_all_feeds asks this function
-- first and skips the feed instead of failing on it.
--
-- The owner. setup_feed refuses an event table outside the ownership chain of changefeed's
-- procedures (51013, since V59), but a feed set up before on such a table is still
-- registered: every read_feed of a login that is only in its readers role fails with
-- Msg 229 (with @with_event = 1 in outbox mode, always in serialized mode). Its code would
-- compile; it is reported instead, with the statement that fixes it and what that statement
-- removes, and regenerated once the table has the right owner. A changed key is named
-- first: it is what would make the regeneration fail.
--
-- The read type (one per feed, both modes) stands for the storage: its columns after ulid
-- are the key as create_feed_storage copied it, in key order. Types are compared as
-- key_columns writes them: an alias type by its base type (system_type_id), a rowversion
-- key as binary(8).
-- @object_id is the event table's id as the registry holds it (checked against the name by
-- the caller), @schema_name and @table_name the registry's spelling.
create or alter function [changefeed].[feed_key_problem] (
    @object_id int,
    @schema_name sysname,
    @table_name sysname
)
returns table
as
return
with stored as (
    select
        row_number() over (order by c.column_id) as key_ordinal,
        c.name,
        c.system_type_id,
        c.max_length,
        c.[precision],
        c.scale,
        c.collation_name
    from sys.table_types as tt
    inner join sys.columns as c
        on c.object_id = tt.type_table_object_id
    where
        tt.schema_id = schema_id(N'changefeed')
        and tt.name = N'type:read:' + @schema_name + N'.' + @table_name
        and c.name collate Latin1_General_100_BIN2 <> N'ulid'
),

current_key as (
    select
        ic.key_ordinal,
        c.name,
        -- 189 is timestamp (rowversion), copied as binary(8) (173).
        convert(tinyint, case when c.system_type_id = 189 then 173 else c.system_type_id end)
            as system_type_id,
        c.max_length,
        c.[precision],
        c.scale,
        c.collation_name
    from sys.indexes as i
    inner join sys.index_columns as ic
        on i.object_id = ic.object_id and i.index_id = ic.index_id
    inner join sys.columns as c
        on ic.object_id = c.object_id and ic.column_id = c.column_id
    where i.object_id = @object_id and i.is_primary_key = 1 and ic.key_ordinal > 0
),

first_difference as (
    select top (1)
        coalesce(s.key_ordinal, k.key_ordinal) as key_ordinal,
        s.name as stored_name,
        k.name as current_name
    from stored as s
    full outer join current_key as k
        on s.key_ordinal = k.key_ordinal
    where
        s.name is null
        or k.name is null
        or s.name <> k.name
        or s.system_type_id <> k.system_type_id
        or s.max_length <> k.max_length
        or s.[precision] <> k.[precision]
        or s.scale <> k.scale
        or isnull(s.collation_name, N'') <> isnull(k.collation_name, N'')
    order by coalesce(s.key_ordinal, k.key_ordinal)
)

select top (1) x.problem
from (
    select
        1 as ordinal,
        convert(
            nvarchar(1000),
            N'The primary key of ''' + @schema_name + N'.' + @table_name
            + N''' changed since it became a feed (key column '
            + convert(nvarchar(10), d.key_ordinal) + N': '
            + case
                when d.stored_name is null then N'added ' + quotename(d.current_name)
                when d.current_name is null then quotename(d.stored_name) + N' is gone'
                when d.stored_name <> d.current_name
                    then quotename(d.stored_name) + N' is now ' + quotename(d.current_name)
                else quotename(d.stored_name) + N' changed its type'
            end
            + N'); the feed''s storage still holds the old key, so its code cannot be'
            + N' regenerated. Restore the key (for a rename: exec sp_rename), or tear the feed'
            + N' down and set it up again: exec changefeed.teardown_feed @table_name = N'''
            + replace(@schema_name + N'.' + @table_name, N'''', N'''''') + N''';'
        -- In the database's collation, as the registry's problem columns it is stored in and
        -- compared with (refresh_feed_status): in a partially contained database the catalog's
        -- names above carry the catalog collation, and mixed with the registry's names they
        -- would leave the text without one (Msg 468/457). Elsewhere the catalog already has the
        -- database's collation, so nothing else changes.
        ) collate database_default as problem
    from first_difference as d

    union all

    -- Cut to the registry's problem column (Msg 2628 on a longer text): the explanation
    -- is cut, not the statement that follows it (owner_chain_problem's text alone may take
    -- 1000).
    select
        2 as ordinal,
        -- Cut in UTF-16 units, as nvarchar(1000) counts: under an _SC collation left()
        -- counts a surrogate pair as one character, and the final cut would take the
        -- statement. A binary collation counts units; the text returns to the database's.
        convert(nvarchar(1000), concat(
            left(o.problem collate Latin1_General_100_BIN2, 1000 - datalength(r.rerun) / 2)
                collate database_default,
            r.rerun
        )) as problem
    from changefeed.owner_chain_problem(@schema_name, @table_name) as o
    cross apply (
        select
            -- Without the name (the text begins with it): a fixed length, so that the cut
            -- above never reaches the fix statement owner_chain_problem names (V101).
            N' Then run changefeed.upgrade_feed for this table.' as rerun
    ) as r
) as x
order by x.ordinal;
