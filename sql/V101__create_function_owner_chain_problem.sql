-- Whether changefeed's procedures reach a table along an unbroken ownership chain: one row
-- with the problem when they do not (who owns what, the statement that fixes it, and what
-- that statement removes), no row when they do. The one place that decides it and says it:
-- setup_feed and setup_outbox refuse such a table (check_owner_chain, 51013), and
-- feed_key_problem and outbox_problem report a feed or outbox set up on one before the
-- check existed, so that the upgrade skips and reports it instead of leaving it broken.
--
-- Why it matters. SQL Server skips the permission check on a table that a procedure reads
-- or writes only when the procedure and the table have one owner (ownership chaining);
-- otherwise it checks the caller. An object's owner is its own principal_id when it has
-- one, else its schema's owner; changefeed's procedures have the changefeed schema's owner
-- (dbo, normally). So with a table in a schema that another user owns, a login that is
-- only in a feed's or an outbox's roles gets Msg 229 from read_feed, enqueue, claim and the
-- acknowledgements. Granting those roles rights on the table instead would give them the
-- whole table, beyond what the roles are for.
--
-- The fix named is the narrowest one: the table alone gets the changefeed schema's owner
-- (alter authorization on object::). What it removes, from ALTER AUTHORIZATION's
-- documentation: transferring an object to a new owner drops every permission on it, so
-- the text says how many there are now and how to list them, to grant them again. Nothing
-- else changes: the schema keeps its owner and its other objects their owners and
-- permissions, and a schema's owner keeps control of the table through the schema; but
-- code that the old owner owns then reaches the table with its callers' permissions only
-- (its own chain to the table breaks), which the text says too. Giving the whole schema
-- away would drop the permissions on the schema and on every object in it without an owner
-- of its own, which is why it is offered only where no table exists yet (setup_outbox
-- creates one: a new table would get the schema's owner).
-- @schema_name and @table_name are parts checked by parse_feed_name (the registry's or the
-- caller's spelling); the text is cut to the registry's problem columns (nvarchar(1000)).
-- The fix statement ends within its first 900 characters even with 128-character names, so
-- a cut takes the explanation after it; callers that append a statement of their own keep
-- room for it (V103, V104).
create or alter function [changefeed].[owner_chain_problem] (
    @schema_name sysname,
    @table_name sysname
)
returns table
as
return
select
    convert(nvarchar(1000), case
        when o.object_id is not null
            then concat(
                N'The table ''', @schema_name, N'.', @table_name, N''' belongs to ''',
                isnull(user_name(t.owner_id), N'?'), N''', changefeed''s procedures to ''',
                isnull(user_name(b.principal_id), N'?'),
                N''': the ownership chain between them is broken, and a login that has only',
                N' changefeed''s roles gets Msg 229 on every call that reads or writes the',
                N' table. Give the table to that owner: alter authorization on object::',
                quotename(@schema_name), N'.', quotename(@table_name), N' to ',
                isnull(quotename(user_name(b.principal_id)), N'[dbo]'),
                N'; This drops the ',
                (
                    select count(*)
                    from sys.database_permissions as p
                    where p.class = 1 and p.major_id = o.object_id
                ),
                N' permissions granted or denied on the table itself (select * from',
                N' sys.database_permissions where class = 1 and major_id = object_id(N''',
                replace(quotename(@schema_name) + N'.' + quotename(@table_name), N'''', N''''''),
                N''') lists them): grant or deny them again after it. The schema and its',
                N' other objects keep their owners and permissions',
                case
                    when o.principal_id is null
                        then concat(
                            N', and the schema''s owner keeps control of the table through',
                            N' the schema'
                        )
                end,
                N'; code owned by ''', isnull(user_name(t.owner_id), N'?'),
                N''' then reaches the table with its callers'' permissions only.'
            )
        else concat(
            N'The schema ''', @schema_name, N''' belongs to ''',
            isnull(user_name(t.owner_id), N'?'), N''', changefeed''s procedures to ''',
            isnull(user_name(b.principal_id), N'?'),
            N''': a table created there would have its owner, outside the ownership chain of',
            N' changefeed''s procedures, and a login that has only changefeed''s roles would',
            N' get Msg 229 on every call. Use a schema that ''',
            isnull(user_name(b.principal_id), N'?'),
            N''' owns, or give this one to it: alter authorization on schema::',
            quotename(@schema_name), N' to ',
            isnull(quotename(user_name(b.principal_id)), N'[dbo]'),
            N'; which drops every permission granted or denied on the schema and on each of',
            N' its objects that has no owner of its own, and takes them from ''',
            isnull(user_name(t.owner_id), N'?'), N'''.'
        )
    -- In the database's collation, as the registry's problem columns it is stored in: in a
    -- partially contained database names from the catalog carry the catalog's collation.
    end) collate database_default as problem
from sys.schemas as s
inner join sys.schemas as b
    on b.name = N'changefeed'
left outer join sys.objects as o
    on o.object_id = object_id(quotename(@schema_name) + N'.' + quotename(@table_name), N'U')
cross apply (
    select coalesce(o.principal_id, s.principal_id) as owner_id
) as t
where s.schema_id = schema_id(@schema_name) and t.owner_id <> b.principal_id;
