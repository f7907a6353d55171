<?php
// GET /near.php?zip=Z&miles=X: everyone within X miles of zip code Z,
// nearest first, with their pictures.
// (near_page in lib.php: a bounding-box query, then haversine in PHP).
declare(strict_types=1);
require __DIR__ . '/lib.php';

$zip = $_GET['zip'] ?? null;
$miles = $_GET['miles'] ?? null;
if (!is_string($zip) || !preg_match('/^[0-9]{5}$/D', $zip)) {
    fail(400, 'zip must be a 5-digit US zip code, e.g. near.php?zip=10001&miles=25');
}
if (!is_string($miles) || !preg_match('/^[0-9]{1,6}(\.[0-9]{1,3})?$/D', $miles)) {
    fail(400, 'miles must be a decimal number of miles (up to 3 decimals), e.g. miles=25 or miles=12.5');
}
$r = (float) $miles;
if ($r <= 0.0 || $r > MAX_MILES) {
    fail(400, sprintf('miles must be more than 0 and at most %g (got %s)', MAX_MILES, $miles));
}

near_page(db(), $zip, $miles, $r);
