-- 002_admin_audit.sql - activities created over the admin API, and the audit
-- trail of every admin action.

-- Activities created with POST /market/admin/coupon/activity take their id
-- from AUTO_INCREMENT (next id = highest id + 1); an INSERT that names its id
-- (tools, tests, older scripts) still works as before.
ALTER TABLE activity MODIFY id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT;

-- One row per admin action (create, update, topup, preheat, revoke), written
-- after the action with what was answered. Rows are only ever appended.
CREATE TABLE IF NOT EXISTS admin_audit (
  id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  admin_sub    VARCHAR(64)     NOT NULL COMMENT 'sub of the admin token (or X-User-Id)',
  action       VARCHAR(16)     NOT NULL COMMENT 'create, update, topup, preheat, revoke',
  activity_id  BIGINT UNSIGNED NULL     COMMENT 'NULL when the action names none (preheat)',
  request_body TEXT            NOT NULL COMMENT 'the JSON body as received (empty if none)',
  http_status  SMALLINT        NOT NULL,
  result       VARCHAR(32)     NOT NULL COMMENT 'the answer''s code: OK, BAD_REQUEST, ENDED, ...',
  message      VARCHAR(255)    NOT NULL DEFAULT '' COMMENT 'the answer''s msg',
  created_at   DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_admin_audit_activity (activity_id, id),
  KEY idx_admin_audit_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

INSERT IGNORE INTO schema_migration (version) VALUES ('002_admin_audit');
