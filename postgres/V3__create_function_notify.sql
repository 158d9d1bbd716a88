-- The AFTER INSERT statement trigger of every outbox (changefeed_notify): NOTIFY on the
-- outbox's channel, tg_argv[0] = 'changefeed:<schema>.<table>' (written by
-- changefeed.setup_outbox). PostgreSQL delivers notifications only when the transaction
-- commits (none after a rollback) and folds identical ones of a transaction into one, so a
-- transaction that enqueues any number of messages sends one notification: the cost is per
-- transaction, not per row. The payload is empty: the relay claims whatever is due, so it
-- needs to know only that something was committed.
create function changefeed.notify()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pg_notify(tg_argv[0], '');
    return null;
end
$$;
