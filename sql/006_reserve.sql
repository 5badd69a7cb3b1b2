-- 006_reserve.sql - node reserves (DESIGN.md "Selling through a slow or
-- missing Redis"). A row is an epoch: `amount` coupons of an activity set
-- aside for one node incarnation. The row is written (open) before the
-- Redis script takes the coupons from stock, and closed only after they went
-- back, so a restore of a Redis that lost its data can count what the
-- nodes still hold: stock = total - coupons - queued - open amounts.
CREATE TABLE IF NOT EXISTS reserve_epoch (
  activity_id BIGINT UNSIGNED NOT NULL,
  incarnation CHAR(32)        NOT NULL COMMENT 'the node instance (its journal directory)',
  epoch       BIGINT UNSIGNED NOT NULL COMMENT 'numbered per (activity, incarnation)',
  amount      INT UNSIGNED    NOT NULL COMMENT 'tokens set aside (at most what was asked)',
  state       TINYINT         NOT NULL DEFAULT 1 COMMENT '1 open, 2 closed',
  closed_by   VARCHAR(16)     NULL COMMENT 'node: given back after replay; admin: returned after its lease',
  returned    INT UNSIGNED    NULL COMMENT 'tokens the give-back put back into stock',
  created_at  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  closed_at   DATETIME(3)     NULL,
  PRIMARY KEY (activity_id, incarnation, epoch),
  KEY idx_reserve_open (state, activity_id),
  KEY idx_reserve_incarnation (incarnation, state),
  CONSTRAINT chk_reserve_state CHECK (state BETWEEN 1 AND 2)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

INSERT IGNORE INTO schema_migration (version) VALUES ('006_reserve');
