-- Drops the feed p_feed: its triggers on the event table, its functions, tables and type, its
-- consumers' cursors and registrations (both cascade from its registry row), its registry row
-- and its two roles. The event table and its rows stay.
-- Safe to run on a feed whose event table was dropped. A role that was granted rights on other
-- objects since (outside changefeed) is left in place with a notice rather than failing the
-- teardown; drop it by hand.
create function changefeed.teardown_feed(p_feed text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set client_min_messages = warning
as $$
declare
    v_feed changefeed.feeds := changefeed.feed_row(p_feed);
    v_id constant integer := v_feed.feed_id;
    v_table text;
    v_role name;
begin
    perform pg_advisory_xact_lock(changefeed.shard_lock_key(0, 0));
    select format('%I.%I', n.nspname, c.relname) into v_table
    from pg_class as c join pg_namespace as n on n.oid = c.relnamespace
    where c.oid = v_feed.table_oid;
    if v_table is not null then
        execute format('drop trigger if exists %I on %s', format('changefeed_capture_%s', v_id), v_table);
        execute format('drop trigger if exists %I on %s', format('changefeed_notify_%s', v_id), v_table);
    end if;
    execute format('drop function if exists changefeed.read_events_%s(integer, bytea, integer)', v_id);
    execute format('drop function if exists changefeed.read_feed_%s(integer, bytea, integer)', v_id);
    execute format('drop function if exists changefeed.lock_feed_%s(integer, timestamptz, integer)', v_id);
    execute format('drop function if exists changefeed.ulid_%s(bigint)', v_id);
    execute format('drop table if exists changefeed.outbox_%s', v_id);
    execute format('drop function if exists changefeed.capture_%s()', v_id);
    execute format('drop table if exists changefeed.feed_%s', v_id);
    execute format('drop table if exists changefeed.state_%s', v_id);
    execute format('drop type if exists changefeed.key_%s', v_id);
    delete from changefeed.feeds where feed_id = v_id;
    foreach v_role in array array[v_feed.readers_role, v_feed.writers_role] loop
        begin
            execute format('revoke all on changefeed.feeds, changefeed.consumer_cursor, '
                || 'changefeed.registered_consumers from %I', v_role);
            execute format('revoke usage on schema changefeed from %I', v_role);
            execute format('drop role if exists %I', v_role);
        exception when dependent_objects_still_exist or insufficient_privilege then
            raise notice 'changefeed.teardown_feed: the role % was left in place: %', v_role, sqlerrm;
        end;
    end loop;
end
$$;
