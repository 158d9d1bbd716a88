-- Regenerates every feed's code (upgrade_feed), each in a subtransaction of its own: a feed
-- that cannot be upgraded (its table dropped, its key changed) is skipped and returned with
-- its problem, and the others are upgraded. A migration that changes generate_feed ends with
-- select * from changefeed.upgrade_all_feeds();
create function changefeed.upgrade_all_feeds()
returns table (feed text, problem text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_name text;
begin
    for v_name in select f.name from changefeed.feeds as f order by f.feed_id loop
        begin
            perform changefeed.upgrade_feed(v_name);
        exception when others then
            feed := v_name;
            problem := sqlerrm;
            return next;
        end;
    end loop;
end
$$;
