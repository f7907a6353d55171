<?php
// GET /near.php?zip=Z&miles=X: everyone within X miles of zip code Z,
// nearest first, with their pictures.
//
// A bounding box on (lat, lon) narrows the rows in the database (an index
// range scan), then the haversine distance in PHP keeps those inside the
// circle; ties in distance are ordered by person id.
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

$db = db();
$q = $db->prepare('SELECT name, lat, lon FROM place WHERE zip = ?');
$q->execute([$zip]);
$centre = $q->fetch(PDO::FETCH_NUM);
if ($centre === false) {
    fail(400, "zip code $zip is not in the database; try one listed on the index page");
}
[$cname, $clat, $clon] = [$centre[0], (float) $centre[1], (float) $centre[2]];

// The box: latitude +- r/R radians; longitude +- r/(R cos(lat)) where lat is
// the box's latitude farthest from the equator (the circle is widest in
// longitude there). Slightly widened so rounding never cuts the circle.
$dlat = $r / EARTH_MILES * 180.0 / M_PI * 1.001;
$far = min(89.0, max(abs($clat - $dlat), abs($clat + $dlat)));
$dlon = $dlat / cos(rad($far));
$q = $db->prepare('SELECT pe.id, pe.name, pl.zip, pl.name, pl.lat, pl.lon
                     FROM place pl JOIN person pe ON pe.place_id = pl.id
                    WHERE pl.lat BETWEEN ? AND ? AND pl.lon BETWEEN ? AND ?');
$q->execute([$clat - $dlat, $clat + $dlat, $clon - $dlon, $clon + $dlon]);
$rows = [];
$scanned = 0;
while (($row = $q->fetch(PDO::FETCH_NUM)) !== false) {
    $scanned++;
    $d = miles_between($clat, $clon, (float) $row[4], (float) $row[5]);
    if ($d <= $r) {
        $rows[] = [(int) $row[0], $row[1], $row[2], $row[3], $d];
    }
}
usort($rows, fn($a, $b) => [$a[4], $a[0]] <=> [$b[4], $b[0]]);

header('Content-Type: text/html; charset=utf-8');
$n = count($rows);
echo "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Within ", h($miles),
    " miles of ", h($zip), "</title></head>\n<body>\n<h1>", $n, " people within ", h($miles),
    " miles of ", h($zip), " (", h($cname), ")</h1>\n";
echo "<p id=\"stats\" data-count=\"$n\" data-scanned=\"$scanned\">", $scanned,
    " places in the bounding box, ", $n, " inside the circle.</p>\n<table>\n";
foreach ($rows as [$id, $pname, $pzip, $plname, $d]) {
    $miles2 = sprintf('%.2f', $d);
    echo "<tr class=\"person\" data-id=\"$id\" data-miles=\"$miles2\"><td><img src=\"/pics/$id.png\" alt=\"\" width=\"96\"></td>",
        "<td><a href=\"/person.php?id=$id\">", h($pname), "</a></td><td>", h($plname), " ", h($pzip),
        "</td><td>$miles2 mi</td></tr>\n";
}
echo "</table>\n</body></html>\n";
