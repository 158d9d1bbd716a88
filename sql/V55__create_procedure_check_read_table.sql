-- Checks a caller's #read before read_feed fills it: every key column must be there, and a
-- character key column must be able to hold every key losslessly. Refuses with 51105 naming
-- the column, its type and the declaration to use.
--
-- Why: #read is the caller's temp table, so a character column takes tempdb's collation
-- unless it says otherwise. A varchar column whose code page differs from the key's stores
-- characters it cannot represent as '?' (a UTF-8 key in a Latin1 tempdb, say) and a shorter
-- column cuts or refuses keys; the caller would then join or look up the wrong rows, or
-- none. (A column of the same code page but another collation stores keys losslessly, but
-- joining it to the event table fails with Msg 468: README tells callers to write
-- collate database_default, or the key's own collation.)
--
-- Internal to read_feed, which creates #changefeed_read_check (ulid and the key columns, as
-- select top (0) ... into from its read type, so with the key's exact types and collations)
-- and then calls this. Both temp tables are the session's own, so their catalog rows are
-- visible to any caller (tempdb.sys.columns), unlike the read type's.
-- Lossless, for a character key column k stored into #read column r:
--   r nchar/nvarchar: at least as many UTF-16 units as k can hold (k varchar(n): n bytes
--     are at most n units in any code page, UTF-8 included);
--   r char/varchar of k's code page (both non-Unicode): at least k's bytes;
--   r char/varchar with a UTF-8 collation: at least 3 bytes per unit or byte of k (a UTF-16
--     unit needs at most 3 UTF-8 bytes; a surrogate pair, two units, needs 4).
--   max holds anything; a max key needs a max column.
create or alter procedure [changefeed].[check_read_table]
as
begin
    set nocount, xact_abort on;

    declare @message nvarchar(2048);

    with expected as (
        select
            c.column_id,
            c.name,
            c.system_type_id,
            c.max_length,
            c.collation_name,
            convert(int, collationproperty(c.collation_name, 'CodePage')) as code_page,
            convert(bit, case when c.system_type_id in (231, 239) then 1 else 0 end)
                as is_unicode
        from tempdb.sys.columns as c
        where
            c.object_id = object_id(N'tempdb..#changefeed_read_check')
            and c.name <> N'ulid'
    ),

    given as (
        select
            c.name,
            c.system_type_id,
            c.max_length,
            c.collation_name,
            convert(int, collationproperty(c.collation_name, 'CodePage')) as code_page,
            convert(bit, case when c.system_type_id in (231, 239) then 1 else 0 end)
                as is_unicode
        from tempdb.sys.columns as c
        where c.object_id = object_id(N'tempdb..#read')
    )

    select top (1)
        @message = concat(
            N'read_feed: #read column ', quotename(e.name),
            case
                when g.name is null then N' is missing'
                else concat(
                    N' is ', type_name(g.system_type_id),
                    case
                        when g.collation_name is null then N''
                        when g.max_length = -1 then N'(max)'
                        when g.is_unicode = 1 then concat(N'(', g.max_length / 2, N')')
                        else concat(N'(', g.max_length, N')')
                    end,
                    case
                        when g.collation_name is null then N''
                        else concat(
                            N' collate ', g.collation_name, N' (code page ', g.code_page, N')'
                        )
                    end
                )
            end,
            N', which cannot hold the feed''s key column ', type_name(e.system_type_id),
            case
                when e.max_length = -1 then N'(max)'
                when e.is_unicode = 1 then concat(N'(', e.max_length / 2, N')')
                else concat(N'(', e.max_length, N')')
            end,
            N' collate ', e.collation_name, N' losslessly. Declare it as the key is declared,',
            N' with the key''s collation (collate database_default when the key uses the',
            N' database''s default), or as nvarchar of the key''s length: create table #read',
            N' (ulid binary(16) not null, ', quotename(e.name), N' ', type_name(e.system_type_id),
            case
                when e.max_length = -1 then N'(max)'
                when e.is_unicode = 1 then concat(N'(', e.max_length / 2, N')')
                else concat(N'(', e.max_length, N')')
            end,
            N' collate database_default not null, ...).'
        )
    from expected as e
    left outer join given as g
        on g.name = e.name
    where
        g.name is null
        or (
            e.collation_name is not null
            and not (
                (
                    g.is_unicode = 1
                    and (
                        g.max_length = -1
                        or (
                            e.max_length <> -1
                            and g.max_length >= case
                                when e.is_unicode = 1 then e.max_length
                                else 2 * e.max_length
                            end
                        )
                    )
                )
                or (
                    g.system_type_id in (167, 175)
                    and e.is_unicode = 0
                    and g.code_page = e.code_page
                    and (g.max_length = -1 or (e.max_length <> -1 and g.max_length >= e.max_length))
                )
                or (
                    g.system_type_id in (167, 175)
                    and g.code_page = 65001
                    and (
                        g.max_length = -1
                        or (
                            e.max_length <> -1
                            and g.max_length >= 3 * case
                                when e.is_unicode = 1 then e.max_length / 2
                                else e.max_length
                            end
                        )
                    )
                )
            )
        )
    order by e.column_id;

    if @message is not null
        throw 51105, @message, 1;
end
