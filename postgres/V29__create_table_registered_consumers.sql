-- The consumers whose saved cursors hold purge_feed back: one row per feed and consumer name.
-- Every member of a feed's readers role may save a cursor under a new consumer name
-- (save_cursor), so a saved cursor alone must not decide what retention keeps: a reader could
-- save a cursor of zeros under an invented name and stop every purge of the feed for good. A
-- consumer holds retention back only once the feed's owner registered it
-- (changefeed.register_consumer); unregister_consumer and remove_consumer undo it. A
-- registration may come before the consumer's first save.
-- feed_id cascades from the registry: teardown_feed's delete of the feed's row takes the
-- feed's registrations with it, so a feed set up again under the name starts with none.
create table changefeed.registered_consumers (
    feed_id integer not null references changefeed.feeds (feed_id) on delete cascade,
    -- The names save_cursor accepts (consumer_cursor's rule), so every consumer can be
    -- registered.
    consumer text not null check (char_length(consumer) between 1 and 200),
    registered_by name not null default current_user,
    registered_at timestamptz not null default now(),
    primary key (feed_id, consumer)
);

-- Writing it is the feed owner's (register_consumer; nobody else is granted INSERT or
-- UPDATE). setup_feed grants a feed's readers role SELECT and DELETE, which this policy
-- narrows to the registrations of consumers the reader owns (a saved cursor of its own):
-- remove_consumer, run by the consumer's owner, deletes the registration with the cursors,
-- so that the freed name does not hand whoever saves under it next a consumer that holds
-- retention back. A reader cannot see or delete another role's registration, nor the
-- registration of a name nobody has saved under yet. The table's owner and superusers are
-- not bound by row-level security.
alter table changefeed.registered_consumers enable row level security;
create policy registered_consumers_own on changefeed.registered_consumers
using (
    exists (
        select 1 from changefeed.consumer_cursor as c
        where c.feed_id = registered_consumers.feed_id
            and c.consumer = registered_consumers.consumer
            and c.owner = current_user
    )
);
