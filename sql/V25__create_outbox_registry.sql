-- The registry of every claim-style outbox set up with changefeed.setup_outbox, so that
-- upgrade_all_feeds can carry their generated procedures forward too.
create table [changefeed].[outboxes] (
    outbox_id int identity (1, 1) not null,
    object_id int not null,
    schema_name sysname not null,
    table_name sysname not null,
    native_json bit not null,
    generator_version int not null,
    created_at datetime2(3) not null
    constraint outboxes_created_at_df default sysutcdatetime(),
    upgraded_at datetime2(3) not null
    constraint outboxes_upgraded_at_df default sysutcdatetime(),
    constraint outboxes_pk primary key clustered (outbox_id),
    constraint outboxes_object_id_uq unique (object_id),
    constraint outboxes_name_uq unique (schema_name, table_name)
);
