-- mark_done for a claim-style outbox, written as the template outbox's procedure (replaces
-- V31's). What changed: the update reads only the rows named in @ids, each sought by its id
-- on the clustered index, the ids driving nested loops (INDEX(1), OPTION (FORCE ORDER, LOOP
-- JOIN)), so it can never wait for an open transaction on another row (the argument is
-- beside the update).
-- Fenced: only messages still processing under @claim_token become done, so a relay whose
-- claim expired and was taken over cannot acknowledge the new holder's work. Returns one
-- row, updated = how many changed. @ids is a JSON array of ids, e.g. N'[12, 13, 15]'.
create or alter procedure [changefeed].[mark_done:changefeed.__template_outbox__]
    @ids nvarchar(max),
    @claim_token uniqueidentifier
as
begin
    set nocount, xact_abort on;
    -- One statement, which commits on its own when the caller has no transaction. Under a
    -- caller's SET IMPLICIT_TRANSACTIONS ON it would open one and return with it open,
    -- holding the acknowledged rows locked: claim would hold back their aggregates until the client
    -- commits. Reverts on return. Inside a caller's transaction it joins that transaction.
    set implicit_transactions off;

    if @claim_token is null
        throw 51302, N'mark_done: @claim_token is null. Pass the claim_token that claim returned with these messages.', 1;
    if @ids is null or isjson(@ids) <> 1 or left(ltrim(@ids), 1) <> N'['
        throw 51302, N'mark_done: @ids must be a JSON array of message ids, e.g. N''[12, 13]''.', 1;

    -- This update must never wait on a row it does not acknowledge, and it reads no
    -- other: each id of @ids is sought on the clustered index, the ids driving
    -- (nested loops). Its reads take update locks, so any other plan would wait: a
    -- scan of the outbox (the optimizer's choice on a small outbox, or for a long
    -- list) reads every row, among them an open transaction's uncommitted enqueue; a
    -- seek of another index on status = 1 (done_by_processed_at) reads every
    -- processing row, among them another transaction's claim not yet committed;
    -- either waits for that transaction to end. Every acknowledgement of every
    -- aggregate would then wait behind one business transaction, its relay's claims
    -- would expire, and their messages would be published again. A row this call
    -- does acknowledge is held by another transaction only when that one claims or
    -- acknowledges the same row, and then waiting for it is right: its outcome
    -- decides whether this fenced update applies.
    -- The plan is pinned as read_feed's delete of moved rows is: FORCE ORDER keeps the
    -- ids, written first, as the outer input, LOOP JOIN makes the join nested loops, so the
    -- outbox is read once per id with that id, and INDEX(1) reads it through the
    -- clustered index (named by its id, not its name: a table made by hand names its
    -- primary key its own way), whose key is exactly (id): an equality on the whole key of
    -- the index read is a single-row seek. upgrade_outbox checks that key before
    -- generating this code, and upgrade_all_feeds skips and reports an outbox without it.
    -- No FORCESEEK: SQL Server refused it on the target of read_feed's delete of moved rows
    -- (Msg 10725, "not allowed for target tables of INSERT, UPDATE, or DELETE statements"),
    -- and its documentation does not settle whether the form without index columns is
    -- refused there too.
    update t
    set
        status = 2,
        processed_at = sysutcdatetime(),
        last_error = null
    from openjson(@ids) with (id bigint '$') as j
    inner join [changefeed].[__template_outbox__] as t with (index(1))
        on t.id = j.id
    where t.status = 1 and t.claim_token = @claim_token
    option (force order, loop join);

    select @@rowcount as updated;
end
