-- 004_change_index.sql - indexes for background passes that cost what changed
-- or is due, not what exists, and a row version precise enough to order
-- writes of derived data (Redis) by.

-- updated_at to the microsecond: it is the version preheat carries into Redis
-- (COUPON:ACTIVITY:VER), and a write never replaces a newer one. Seconds
-- would let two changes in one second look alike. The periodic preheat reads
-- rows changed since its last pass through idx_activity_updated.
-- Reconciliation takes open and recently ended sales by idx_activity_end;
-- the status job finds sales due to end by idx_activity_status_end; preheat
-- finds sales entering its horizon by idx_activity_start.
ALTER TABLE activity
  MODIFY updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
                    ON UPDATE CURRENT_TIMESTAMP(6),
  ADD KEY IF NOT EXISTS idx_activity_updated (updated_at),
  ADD KEY IF NOT EXISTS idx_activity_end (distribute_end_time),
  ADD KEY IF NOT EXISTS idx_activity_start (distribute_start_time),
  ADD KEY IF NOT EXISTS idx_activity_status_end (status, distribute_end_time);

INSERT IGNORE INTO schema_migration (version) VALUES ('004_change_index');
