-- (Replaces V87's.) What is wrong with a claim outbox table that would make the code
-- generated for it fail, with what fixes it; NULL when nothing is. What changed: the last
-- check below, the table's owner. One row, always. upgrade_outbox refuses such an
-- outbox (51016) and upgrade_all_feeds skips and reports it, both before generating
-- anything: a regeneration that failed under XACT_ABORT would roll back the whole upgrade
-- (see upgrade_all_feeds). What the code needs, in the order checked:
--   every column of the template outbox, which its procedures name (Msg 207 when they are
--     created otherwise), but claim_expires_at: an outbox that the migration adding that
--     column skipped as broken lacks it, and upgrade_outbox adds it itself (through
--     create_outbox_storage: nullable, metadata only). Every missing column is named, so
--     that one repair is enough;
--   the clustered index: unique, rowstore, enabled, keyed on (id) alone. The code pins its
--     plans: the claim's update and the acknowledgements read INDEX(1), the clustered
--     index, by id (an equality on id is then a single-row seek that reads no other row). A
--     hint the table cannot satisfy fails every call instead of compiling to another plan
--     (INDEX(1) on a heap is refused), and a clustered index on another key would turn
--     those reads into scans, which wait for any open transaction's row;
--   head_of_aggregate, by that name, which the claim's head probe reads
--     (INDEX(head_of_aggregate); Msg 308 when no index has that name): a nonclustered
--     rowstore index, enabled, unfiltered, keyed on (aggregate_id, id) in that order, with
--     status among its included columns (the claim's committed probe relies on an update
--     of status locking this index's key).
--   the table's owner: the changefeed schema's owner (changefeed.owner_chain_problem).
--     setup_outbox refuses any other since V106 (51013); an outbox set up before on such a
--     table is reported here. Its code would compile, but every call of a login that has
--     only the outbox's roles (relay, enqueue) fails with Msg 229, since the ownership
--     chain from the procedures to the table is broken. So it is not regenerated until the
--     table has that owner, and the text says the statement that gives it, with what that
--     statement removes.
-- A column or an index dropped, renamed or re-created otherwise by hand therefore breaks
-- the outbox.
-- Internal: the inputs are an existing table's object id (the callers report a missing
-- table themselves) and a registered outbox's names and native_json (for the setup_outbox
-- call in the fixes); names come from the registry, so the text says them as the owner
-- wrote them.
create or alter function [changefeed].[outbox_problem] (
    @object_id int,
    @schema_name sysname,
    @table_name sysname,
    @native_json bit
)
returns table
as
return
select
    -- concat: a NULL piece is empty, never a NULL text (NULL means "no problem"). Cut to
    -- outboxes.problem's length explicitly, so that a long name cannot make the update of
    -- the registry fail on truncation (Msg 2628).
    convert(nvarchar(1000), case
        when m.missing is not null
            then concat(
                N'The claim outbox ''', @schema_name, N'.', @table_name,
                N''' lacks the columns ', m.missing,
                N', which its procedures use (renamed or dropped since setup)',
                case
                    when m.lacks_claim_expiry = 1
                        then N'; claim_expires_at, which it lacks too, upgrade_outbox adds itself'
                end,
                N'. Rename them back (exec sp_rename) or add them again as setup_outbox',
                N' creates them, then run exec changefeed.upgrade_outbox @table_name = N''',
                replace(concat(@schema_name, N'.', @table_name), N'''', N''''''),
                N''';'
            )
        when c.usable = 0
            then concat(
                N'The claim outbox ''', @schema_name, N'.', @table_name,
                N''' has no unique clustered index on (id) alone, through which its claim and',
                N' acknowledgements read their rows by id (INDEX(1)): on a heap every such call',
                N' would fail, on another key it would scan the outbox and wait for open',
                N' transactions. Make (id) its unique clustered index again (primary key',
                N' clustered (id), as setup_outbox creates it), then run exec',
                N' changefeed.setup_outbox @table_name = N''',
                replace(concat(@schema_name, N'.', @table_name), N'''', N''''''),
                N'''', case when @native_json = 1 then N', @native_json = 1' end, N';'
            )
        when h.found = 0
            then concat(
                N'The index head_of_aggregate of the claim outbox ''', @schema_name, N'.',
                @table_name,
                N''', which its claim reads by name (INDEX(head_of_aggregate)), was dropped',
                N' or renamed: every claim would fail (Msg 308). Rename it back (exec',
                N' sp_rename with @objtype = N''INDEX''), or let setup_outbox create it',
                N' again and regenerate the procedures: exec changefeed.setup_outbox',
                N' @table_name = N''',
                replace(concat(@schema_name, N'.', @table_name), N'''', N''''''),
                N'''', case when @native_json = 1 then N', @native_json = 1' end, N';'
            )
        when h.usable = 0
            then concat(
                N'The index head_of_aggregate of the claim outbox ''', @schema_name, N'.',
                @table_name,
                N''' is not the one its claim reads by name (enabled, unfiltered, keyed on',
                N' (aggregate_id, id), status included). Drop it (drop index',
                N' head_of_aggregate on ', quotename(@schema_name), N'.', quotename(@table_name),
                N') and let setup_outbox create it again and regenerate the procedures:',
                N' exec changefeed.setup_outbox @table_name = N''',
                replace(concat(@schema_name, N'.', @table_name), N'''', N''''''),
                N'''', case when @native_json = 1 then N', @native_json = 1' end, N';'
            )
        -- The explanation is cut, not the statement that follows it: the whole is cut to
        -- 1000 below, and owner_chain_problem's text alone may take 1000. Cut in UTF-16
        -- units, as nvarchar(1000) counts: under an _SC collation left() counts a surrogate
        -- pair as one character. A binary collation counts units; the text returns to the
        -- database's.
        when w.problem is not null
            then concat(
                left(w.problem collate Latin1_General_100_BIN2, 1000 - datalength(r.rerun) / 2)
                    collate database_default,
                r.rerun
            )
    end) as problem
from (
    -- The template's columns the table lacks, in the template's order. An aggregate without
    -- GROUP BY gives one row even when nothing is missing (missing is NULL then, and
    -- string_agg skips the NULL that stands for claim_expires_at). nvarchar(max) pieces:
    -- string_agg of a shorter type fails past 8000 bytes instead of growing.
    select
        string_agg(
            case
                when t.name <> N'claim_expires_at'
                    then convert(nvarchar(max), quotename(t.name) collate database_default)
            end,
            N', '
        ) within group (order by t.column_id) as missing,
        max(case when t.name = N'claim_expires_at' then 1 else 0 end) as lacks_claim_expiry
    from sys.columns as t
    where
        t.object_id = object_id(N'[changefeed].[__template_outbox__]', N'U')
        and not exists (
            select 1
            from sys.columns as col
            where col.object_id = @object_id and col.name = t.name
        )
) as m
cross join (
    select
        convert(bit, case
            when exists (
                select 1
                from sys.indexes as i
                where
                    i.object_id = @object_id
                    and i.index_id = 1
                    and i.type = 1
                    and i.is_unique = 1
                    and i.is_disabled = 0
                    and i.is_hypothetical = 0
                    -- Its one key column is id.
                    and exists (
                        select 1
                        from sys.index_columns as ic
                        inner join sys.columns as col
                            on col.object_id = ic.object_id and col.column_id = ic.column_id
                        where
                            ic.object_id = i.object_id
                            and ic.index_id = i.index_id
                            and ic.key_ordinal = 1
                            and col.name = N'id'
                    )
                    and not exists (
                        select 1
                        from sys.index_columns as ic
                        where
                            ic.object_id = i.object_id
                            and ic.index_id = i.index_id
                            and ic.key_ordinal > 1
                    )
            ) then 1 else 0
        end) as usable
) as c
cross apply (
    select
        convert(bit, case
            when exists (
                select 1
                from sys.indexes as i
                where
                    i.object_id = @object_id
                    and i.name = N'head_of_aggregate'
                -- A hypothetical index of the name counts as found (and then as not
                -- usable, whose advice is to drop it): setup_outbox looks for the name
                -- alone and would not create the index again.
            ) then 1 else 0
        end) as found,
        convert(bit, case
            when exists (
                select 1
                from sys.indexes as i
                where
                    i.object_id = @object_id
                    and i.name = N'head_of_aggregate'
                    and i.type = 2
                    and i.is_disabled = 0
                    and i.is_hypothetical = 0
                    and i.has_filter = 0
                    -- Keyed on (aggregate_id, id), in that order, and on nothing else.
                    and exists (
                        select 1
                        from sys.index_columns as ic
                        inner join sys.columns as col
                            on col.object_id = ic.object_id and col.column_id = ic.column_id
                        where
                            ic.object_id = i.object_id
                            and ic.index_id = i.index_id
                            and ic.key_ordinal = 1
                            and col.name = N'aggregate_id'
                    )
                    and exists (
                        select 1
                        from sys.index_columns as ic
                        inner join sys.columns as col
                            on col.object_id = ic.object_id and col.column_id = ic.column_id
                        where
                            ic.object_id = i.object_id
                            and ic.index_id = i.index_id
                            and ic.key_ordinal = 2
                            and col.name = N'id'
                    )
                    and not exists (
                        select 1
                        from sys.index_columns as ic
                        where
                            ic.object_id = i.object_id
                            and ic.index_id = i.index_id
                            and ic.key_ordinal > 2
                    )
                    -- status is included.
                    and exists (
                        select 1
                        from sys.index_columns as ic
                        inner join sys.columns as col
                            on col.object_id = ic.object_id and col.column_id = ic.column_id
                        where
                            ic.object_id = i.object_id
                            and ic.index_id = i.index_id
                            and ic.is_included_column = 1
                            and col.name = N'status'
                    )
            ) then 1 else 0
        end) as usable
) as h
outer apply changefeed.owner_chain_problem(@schema_name, @table_name) as w
cross apply (
    select
        -- Without the name (the text begins with it): a fixed length, so that the cut
        -- above never reaches the fix statement owner_chain_problem names (V101).
        N' Then run changefeed.upgrade_outbox for this table.' as rerun
) as r;
