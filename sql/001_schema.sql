-- 001_schema.sql - activities and the coupons seized from them.
-- Invariant kept by every transaction: activity.total_num = activity.stock_num
-- + (rows in coupon for that activity).

CREATE TABLE IF NOT EXISTS activity (
  id                    BIGINT UNSIGNED NOT NULL,
  name                  VARCHAR(128)    NOT NULL,
  coupon_name           VARCHAR(128)    NOT NULL DEFAULT '',
  coupon_type           TINYINT         NOT NULL DEFAULT 1 COMMENT '1 fixed amount, 2 discount',
  coupon_amount         DECIMAL(12,2)   NOT NULL DEFAULT 0.00,
  coupon_threshold      DECIMAL(12,2)   NOT NULL DEFAULT 0.00 COMMENT 'minimum order amount',
  total_num             INT UNSIGNED    NOT NULL,
  stock_num             INT UNSIGNED    NOT NULL,
  distribute_start_time DATETIME        NOT NULL,
  distribute_end_time   DATETIME        NOT NULL,
  validity_days         INT UNSIGNED    NOT NULL DEFAULT 30,
  status                TINYINT         NOT NULL DEFAULT 1
                        COMMENT '1 not started, 2 in progress, 3 ended, 4 voided',
  created_at            DATETIME        NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at            DATETIME        NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
  PRIMARY KEY (id),
  KEY idx_activity_status_start (status, distribute_start_time),
  CONSTRAINT chk_activity_stock CHECK (stock_num <= total_num),
  CONSTRAINT chk_activity_window CHECK (distribute_end_time > distribute_start_time),
  CONSTRAINT chk_activity_status CHECK (status BETWEEN 1 AND 4)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS coupon (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  activity_id BIGINT UNSIGNED NOT NULL,
  user_id     BIGINT UNSIGNED NOT NULL,
  status      TINYINT         NOT NULL DEFAULT 1 COMMENT '1 unused, 2 used, 3 expired, 4 voided',
  seized_at   DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  valid_until DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  created_at  DATETIME        NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at  DATETIME        NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
  PRIMARY KEY (id),
  UNIQUE KEY uk_coupon_activity_user (activity_id, user_id),
  KEY idx_coupon_user (user_id),
  CONSTRAINT chk_coupon_status CHECK (status BETWEEN 1 AND 4)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS schema_migration (
  version    VARCHAR(64) NOT NULL,
  applied_at DATETIME    NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

INSERT IGNORE INTO schema_migration (version) VALUES ('001_schema');
