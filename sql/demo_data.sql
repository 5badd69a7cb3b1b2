-- demo_data.sql - sample activities for a local try-out (not a migration).
INSERT IGNORE INTO activity (id, name, total_num, stock_num, distribute_start_time,
                             distribute_end_time, validity_days, status)
VALUES
  (1, 'Demo: 1,000 coupons, on sale now', 1000, 1000, NOW() - INTERVAL 1 MINUTE,
   NOW() + INTERVAL 1 DAY, 30, 2),
  (2, 'Demo: starts in one hour', 500, 500, NOW() + INTERVAL 1 HOUR,
   NOW() + INTERVAL 2 HOUR, 7, 1);
