-- The BEFORE INSERT row trigger of every outbox (changefeed_order): it makes the ids of one
-- aggregate follow the commit order of their transactions, which the claim's
-- head-of-aggregate rule depends on (ARCHITECTURE.md, "The claim outbox on PostgreSQL").
--
-- A sequence value is handed out before the row is written and long before its transaction
-- commits, so without this two transactions enqueuing for one aggregate could commit in the
-- opposite order of their ids: a relay would then claim and publish the later message while
-- the earlier one is still invisible to it. Here a row of an aggregate first takes a
-- transaction-level advisory lock for (outbox, aggregate) and only then draws its id: a
-- second enqueuer of that aggregate waits until the first commits or rolls back, and so
-- draws a higher id only once every lower id of the aggregate is committed or gone. The id
-- that the column default drew before the trigger ran is discarded (a gap, as a rollback
-- leaves). Rows without an aggregate take no lock.
--
-- The lock key is one bigint, hashtextextended of the table's oid and the aggregate id. Two
-- aggregates whose keys collide only wait for each other; the order stays right.
--
-- tg_argv[0] is the id column's sequence, written by changefeed.setup_outbox.
create function changefeed.order_aggregate()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if new.aggregate_id is not null then
        perform pg_advisory_xact_lock(
            hashtextextended(tg_relid::text || '/' || new.aggregate_id, 0)
        );
        new.id := nextval(tg_argv[0]::regclass);
    end if;
    return new;
end
$$;
