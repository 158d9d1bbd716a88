-- claim for a claim-style outbox, written as the template outbox's procedure (replaces V77's).
-- What changed: the claim's update reads only its candidates, each sought by id on the
-- clustered index, @candidates driving nested loops (INDEX(1), OPTION (FORCE ORDER, LOOP
-- JOIN)), so it can never wait for an open transaction (the argument is beside the update).
-- Since V77: @wait_ms, a claim that waits for work. With nothing due, the claim tries
-- again after short pauses (changefeed.pause_wait: 2 ms doubling to 20 ms) until it claims
-- something or @wait_ms has passed, and then returns what it claimed (an empty result when
-- nothing came). So a relay learns of a committed message within one pause instead of its
-- poll interval, and an idle relay costs one cheap probe every 20 ms on the server and one
-- round trip per @wait_ms on the network.
-- The pause is between transactions: each try is the whole claim below (its own short
-- transaction, committed or rolled back before the pause), so a waiting claim holds no lock
-- and no transaction while it pauses and never delays an enqueue, an acknowledgement or
-- another claimer. Hence a wait inside the caller's transaction is refused (51311): there
-- the pauses would hold the caller's locks. @wait_ms = 0 (the default) tries once, as
-- before, in or out of a transaction.
-- Each try takes its own time: a row claimed after a pause expires @claim_timeout_ms after
-- that try, not after the call began.
-- Claims up to @batch_size due messages under a fresh claim token, held for
-- @claim_timeout_ms, and returns them ordered by id. Due: pending; failed whose retry time
-- has come; processing whose claim has expired (the reaper: that counts an attempt).
-- Head of aggregate only: a message is claimed only when every earlier message of its
-- aggregate is done or dead, so at most one message per aggregate is in flight and an
-- aggregate's messages are published in id order. Messages without an aggregate are
-- never held back.
--
-- Liveness: the claim never waits for a row lock. An open transaction (a business
-- transaction holding an uncommitted enqueue, an acknowledgement in flight) delays only
-- the aggregate it touches; every other aggregate is claimed as usual.
--
-- How "every earlier message is done or dead" is decided without waiting. An earlier row
-- of the aggregate is read twice, on the head_of_aggregate index:
--   dirty      READUNCOMMITTED: every row as it is now, committed or not (an uncommitted
--              enqueue is there; a row whose delete is uncommitted is not);
--   committed  READCOMMITTEDLOCK, READPAST: only rows no other transaction holds, with
--              their committed status; a row an open transaction inserted or changed is
--              skipped instead of waited for.
-- The candidate is the head when every row the dirty read sees is also seen by the
-- committed read, unlocked and done or dead (dirty EXCEPT committed-and-closed is empty).
-- So an earlier row that an open transaction holds (an uncommitted enqueue of the same
-- aggregate, a claim or an acknowledgement not yet committed) makes the candidate wait for
-- a later claim, whatever that transaction will do; an earlier row that is committed and
-- still open (pending, processing, failed) does too. Only the rows of the candidate's own
-- aggregate are read, so only that aggregate waits. Cost: each read of a head candidate
-- walks the aggregate's rows not yet purged (as the single probe before it did), so keep
-- aggregates fine-grained (an order, not a tenant) and purge done rows.
-- Why not simpler:
--   * a locking probe without READPAST (the previous design) waits for the open
--     transaction: one business transaction left open stops every claim, for every
--     aggregate;
--   * READPAST alone skips the held earlier row as if it did not exist: a later committed
--     row would overtake an uncommitted earlier one, or be claimed while another claimer
--     is claiming (or a relay failing) the earlier one;
--   * a dirty read alone trusts an acknowledgement that has not committed: if it rolls
--     back, the earlier row is processing again while the later one was claimed.
-- Each read observes each row once, at some moment; the two reads may see a row at
-- different moments, and the rule holds for any interleaving: a row accepted by the
-- committed read was committed done or dead at that moment (only an operator's redrive
-- reopens it); a row the dirty read cannot see was not yet inserted or is being deleted.
-- No row is invisible to the dirty read while a later row of its aggregate can commit: an
-- insert may wait after taking its id and before its head_of_aggregate entry exists (on a
-- SERIALIZABLE reader's range lock, a hand-inserted duplicate message_id, log growth), but
-- enqueue holds its aggregate's applock from before the id is taken until the insert has
-- returned, so no later id of that aggregate exists until the earlier row is in this index
-- (enqueue; ARCHITECTURE.md, "No message is invisible to the head probe").
-- What remains, documented in README.md (claim outbox): a row deleted by hand while open,
-- by a transaction that then rolls back; and rows inserted by hand, without enqueue, which
-- take no aggregate lock.
-- The dirty read may fail with error 601 (data moved under it by a page split or a
-- purge); the claim then rolls back having claimed nothing, and clients retry it (transient).
-- The held aggregates and the sessions holding them are listed by
-- [changefeed].[held_aggregates:changefeed.__template_outbox__] (POWEROFF.md).
--
-- Two statements in one transaction: the first picks the candidates (reading, UPDLOCK
-- held to the commit), the second claims them. Locking hints, each for a reason:
--   READCOMMITTEDLOCK  locking reads even under READ_COMMITTED_SNAPSHOT; without it the
--                      scan would read row versions and two claimers could take one row.
--   READPAST           skip rows another claimer or a writer holds instead of waiting.
--   UPDLOCK, ROWLOCK   hold the candidates until the update, row by row, so concurrent
--                      claimers never take the same row and never lock more than it.
--   READUNCOMMITTED    the dirty read of the head probe (above); it takes no row locks.
--   INDEX(head_of_aggregate)  both probe reads on one index, whose key an update of
--                      status locks (status is an included column), so a row changed
--                      by an open transaction is seen as held by the committed read. It
--                      is unfiltered on purpose: in a filtered index on open rows
--                      (open_messages) an acknowledgement deletes the row's entry, and
--                      an uncommitted delete is a ghost that both reads skip, so the
--                      acknowledgement in flight would be invisible to the probe.
--   INDEX(1), FORCE ORDER, LOOP JOIN  the update's pinned plan (beside it).
--   MAXDOP 1           parallel plans with READPAST/UPDLOCK are known to deadlock.
create or alter procedure [changefeed].[claim:changefeed.__template_outbox__]
    @batch_size int = 100,
    @claim_timeout_ms int = 30000,
    @wait_ms int = 0
as
begin
    set nocount, xact_abort on;
    -- It begins and commits its own transaction: under a caller's SET IMPLICIT_TRANSACTIONS
    -- ON that commit would leave a level open, holding the claimed rows' locks. Reverts on
    -- return.
    set implicit_transactions off;
    -- READPAST needs a locking isolation level; this reverts on return.
    set transaction isolation level read committed;

    if @batch_size is null or @batch_size < 1 or @batch_size > 10000
        throw 51301, N'claim: @batch_size must be between 1 and 10000.', 1;
    if @claim_timeout_ms is null or @claim_timeout_ms < 1 or @claim_timeout_ms > 86400000
        throw 51301, N'claim: @claim_timeout_ms must be between 1 and 86400000 (24 hours).', 1;
    if @wait_ms is null or @wait_ms < 0 or @wait_ms > 3600000
        throw 51301, N'claim: @wait_ms must be between 0 and 3600000 (one hour).', 1;
    if @wait_ms > 0 and @@trancount > 0
        throw 51311, N'claim: @wait_ms > 0 inside a transaction: the claim would pause with your transaction''s locks held. Claim outside a transaction (under SET IMPLICIT_TRANSACTIONS ON, any earlier statement of the session opened one), or pass @wait_ms = 0.', 1;

    declare @token uniqueidentifier = newid();
    declare @now datetime2(3);
    -- Only for rows claimed before claim_expires_at existed (see the top).
    declare @expired_before datetime2(3);
    declare @expires_at datetime2(3);
    declare @deadline datetime2(3) = dateadd(millisecond, @wait_ms, sysutcdatetime());
    -- The first pause: 2 ms (pause_wait: datetime rounds a 1 ms pause to none).
    declare @pause_ms int = 2;
    declare @candidates table (id bigint not null primary key);
    -- The key columns keep the table's binary collation (a table variable's columns would
    -- otherwise take the database default).
    declare @claimed table (
        id bigint not null primary key,
        message_id nvarchar(64) collate Latin1_General_100_BIN2 not null,
        topic nvarchar(256) not null,
        aggregate_type nvarchar(128) null,
        aggregate_id nvarchar(256) collate Latin1_General_100_BIN2 null,
        partition_key nvarchar(256) collate Latin1_General_100_BIN2 null,
        payload nvarchar(max) not null,
        headers nvarchar(max) null,
        trace_id nvarchar(128) null,
        attempts int not null
    );

    while 1 = 1
    begin
        -- Every try reads the clock anew: due and expired are decided at the try, and the
        -- claim expires @claim_timeout_ms after the try that made it.
        set @now = sysutcdatetime();
        set @expired_before = dateadd(millisecond, -@claim_timeout_ms, @now);
        set @expires_at = dateadd(millisecond, @claim_timeout_ms, @now);
        -- Empty after a try that claimed nothing anyway (every candidate is held by UPDLOCK
        -- until the update claims it); cleared so that each try starts from nothing.
        delete from @candidates;

        begin try
            begin transaction;

            insert into @candidates (id)
            select top (@batch_size) t.id
            from [changefeed].[__template_outbox__] as t
                with (readcommittedlock, readpast, updlock, rowlock)
            where
                -- Matches the open_messages filter, so that index can serve the scan.
                t.status in (0, 1, 3)
                and (
                    t.status = 0
                    or (t.status = 3 and t.next_retry_at <= @now)
                    or (
                        t.status = 1
                        and (
                            t.claim_expires_at < @now
                            or (t.claim_expires_at is null and t.claimed_at < @expired_before)
                        )
                    )
                )
                and (
                    t.aggregate_id is null
                    or not exists (
                        select dirty.id
                        from [changefeed].[__template_outbox__] as dirty
                            with (readuncommitted, index(head_of_aggregate))
                        where dirty.aggregate_id = t.aggregate_id and dirty.id < t.id
                        except
                        select committed.id
                        from [changefeed].[__template_outbox__] as committed
                            with (readcommittedlock, readpast, index(head_of_aggregate))
                        where
                            committed.aggregate_id = t.aggregate_id
                            and committed.id < t.id
                            and committed.status in (2, 4)
                    )
                )
            order by t.id
            option (maxdop 1);

            -- The candidates are ours until the commit (UPDLOCK): no other claim or
            -- acknowledgement can change their status in between.
            --
            -- This update must never wait, and it reads no row but its candidates: each is
            -- sought by its id on the clustered index, @candidates driving (nested loops).
            -- Its reads take update locks, so any other plan would wait: a scan of the
            -- outbox, or a merge or hash join (which scans it), reads every row, among them
            -- an open transaction's uncommitted enqueue (locked exclusively until that
            -- transaction ends) and rows another claimer or an acknowledgement holds. One
            -- business transaction left open would then stop the claims of every
            -- aggregate, what the head probe above is built never to do, and a relay
            -- blocked past its claim timeout has its rows claimed and published again. The
            -- optimizer picks such a plan by itself where a scan is cheap: a small outbox.
            -- The candidates are held by this transaction already, so seeking exactly them
            -- cannot wait.
            -- The plan is pinned as read_feed's delete of moved rows is: FORCE ORDER keeps
            -- @candidates, written first, as the outer input, LOOP JOIN makes the join
            -- nested loops, so the outbox is read once per candidate with that candidate's
            -- id, and INDEX(1) reads it through the clustered index (named by its id, not
            -- its name: a table made by hand names its primary key its own way), whose key
            -- is exactly (id): an equality on the whole key of the index read is a
            -- single-row seek. upgrade_outbox checks that key before generating this code,
            -- and upgrade_all_feeds skips and reports an outbox without it. No FORCESEEK:
            -- SQL Server refused it on the target of read_feed's delete (Msg 10725, "not
            -- allowed for target tables of INSERT, UPDATE, or DELETE statements"), and its
            -- documentation does not settle whether the form without index columns is
            -- refused there too.
            update t
            set
                attempts = t.attempts + case when t.status = 1 then 1 else 0 end,
                status = 1,
                claimed_at = @now,
                claim_expires_at = @expires_at,
                claim_token = @token
            output
                inserted.id,
                inserted.message_id,
                inserted.topic,
                inserted.aggregate_type,
                inserted.aggregate_id,
                -- Explicit on both sides: the two columns of an existing table may have
                -- different collations, and the result must have one.
                coalesce(
                    inserted.partition_key collate Latin1_General_100_BIN2,
                    inserted.aggregate_id collate Latin1_General_100_BIN2
                ),
                convert(nvarchar(max), inserted.payload),
                convert(nvarchar(max), inserted.headers),
                inserted.trace_id,
                inserted.attempts
            into @claimed (
                id, message_id, topic, aggregate_type, aggregate_id, partition_key,
                payload, headers, trace_id, attempts
            )
            from @candidates as c
            inner join [changefeed].[__template_outbox__] as t with (rowlock, index(1))
                on t.id = c.id
            option (force order, loop join, maxdop 1);

            commit transaction;
        end try
        begin catch
            if @@trancount > 0 rollback transaction;
            throw;
        end catch;

        -- No transaction of ours is open here (committed above). @wait_ms = 0 is one try
        -- whatever the clock says: @deadline, rounded to datetime2(3), can be up to half a
        -- millisecond past the call's start.
        if @wait_ms = 0 or exists (select 1 from @claimed) or sysutcdatetime() >= @deadline
            break;

        exec changefeed.pause_wait
            @deadline = @deadline,
            @max_pause_ms = 20,
            @pause_ms = @pause_ms output;
    end;

    select
        id,
        message_id,
        topic,
        aggregate_type,
        aggregate_id,
        partition_key,
        payload,
        headers,
        trace_id,
        attempts,
        @token as claim_token
    from @claimed
    order by id;
end
