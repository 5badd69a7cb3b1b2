-- 005_coupon_lifecycle.sql - a coupon after the seize: use and release by an
-- order, expiry, and return on expiry (DESIGN.md "Coupon lifecycle and
-- eligibility").
--
-- The invariant becomes: activity.total_num = activity.stock_num + (rows in
-- coupon for that activity with returned = 0). A returned coupon gave its
-- stock back and no longer counts; it stays visible (status 3, expired).
--
-- Safe to run twice (MariaDB's IF [NOT] EXISTS on every change), as every
-- file in sql/ is.

-- return_on_expiry: an unused coupon that expires while the sale is open
-- gives its stock back. eligible_groups: NULL (anyone) or a JSON array of
-- group names, one of which the seizer's token must carry.
ALTER TABLE activity
  ADD COLUMN IF NOT EXISTS return_on_expiry TINYINT NOT NULL DEFAULT 0
    COMMENT '1: an expired unused coupon gives its stock back while the sale is open',
  ADD COLUMN IF NOT EXISTS eligible_groups VARCHAR(1024) NULL DEFAULT NULL
    COMMENT 'JSON array of user groups that may seize; NULL: anyone';

-- order_id / used_at: set while used (status 2) by that order.
-- returned: 0 the coupon counts against the stock; 1 its stock was given
-- back in MySQL and Redis is still to follow; 2 given back in both.
-- live_key: 0 while the coupon counts, its own id once returned. With it in
-- the unique key, a user holds at most one coupon that counts per activity,
-- and may seize again after a return.
-- uk_coupon_seize (activity, user, seize time) keeps coupon-sync's replay
-- harmless after a return: a queue entry replayed after its coupon was
-- returned carries the same seize time (Redis' clock, ms) and is ignored by
-- INSERT IGNORE, so it can never become a second live coupon. A new seize
-- after the return has a later time and a live_key of 0 that is free.
ALTER TABLE coupon
  ADD COLUMN IF NOT EXISTS order_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL DEFAULT NULL
    COMMENT 'the order that used it (status 2)',
  ADD COLUMN IF NOT EXISTS used_at DATETIME(3) NULL DEFAULT NULL,
  ADD COLUMN IF NOT EXISTS returned TINYINT NOT NULL DEFAULT 0
    COMMENT '0 counts; 1 stock back in MySQL, Redis pending; 2 stock back in both',
  ADD COLUMN IF NOT EXISTS live_key BIGINT UNSIGNED NOT NULL DEFAULT 0
    COMMENT '0 while the coupon counts, its id once returned';

ALTER TABLE coupon
  ADD UNIQUE KEY IF NOT EXISTS uk_coupon_live (activity_id, user_id, live_key),
  ADD UNIQUE KEY IF NOT EXISTS uk_coupon_seize (activity_id, user_id, seized_at),
  DROP KEY IF EXISTS uk_coupon_activity_user,
  -- The expiry pass reads only the coupons due: status = 1 AND valid_until <= now.
  ADD KEY IF NOT EXISTS idx_coupon_due (status, valid_until),
  -- "mine": a user's coupons newest first, by status or all.
  ADD KEY IF NOT EXISTS idx_coupon_user_seized (user_id, seized_at),
  -- Per-activity counts by state (the operator page), from the index alone.
  ADD KEY IF NOT EXISTS idx_coupon_activity_state (activity_id, status, returned),
  -- Returns whose Redis step is still to follow.
  ADD KEY IF NOT EXISTS idx_coupon_returned (returned),
  ADD CONSTRAINT IF NOT EXISTS chk_coupon_returned CHECK (returned BETWEEN 0 AND 2);

INSERT IGNORE INTO schema_migration (version) VALUES ('005_coupon_lifecycle');
