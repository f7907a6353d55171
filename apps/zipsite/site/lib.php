<?php
// The zipsite's shared code: the database connection (PDO, prepared
// statements only), input checks that answer 400 naming the fix, and the
// great-circle distance.
//
// The database comes from the environment (Apache: SetEnv ZIPSITE_DSN ...):
//   ZIPSITE_DSN=sqlite:/path/zipsite.db                       (the default kind)
//   ZIPSITE_DSN="pgsql:host=/run/dir;port=5432;dbname=zipsite" ZIPSITE_DB_USER=zipsite
declare(strict_types=1);

const EARTH_MILES = 3958.8;   // mean Earth radius (IUGG), statute miles
const MAX_MILES = 100.0;      // larger radii are refused (pages stay bounded)

function fail(int $status, string $msg): never
{
    http_response_code($status);
    header('Content-Type: text/plain; charset=utf-8');
    echo "zipsite: $msg\n";
    exit;
}

function db(): PDO
{
    $dsn = $_SERVER['ZIPSITE_DSN'] ?? getenv('ZIPSITE_DSN');
    if (!is_string($dsn) || $dsn === '') {
        fail(500, 'ZIPSITE_DSN is not set: add "SetEnv ZIPSITE_DSN sqlite:/path/zipsite.db" to the Apache configuration');
    }
    $user = $_SERVER['ZIPSITE_DB_USER'] ?? getenv('ZIPSITE_DB_USER');
    try {
        return new PDO($dsn, is_string($user) ? $user : null, null, [
            PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
            PDO::ATTR_EMULATE_PREPARES => false,
            // One connection per Apache worker, kept between requests.
            PDO::ATTR_PERSISTENT => str_starts_with($dsn, 'pgsql:'),
        ]);
    } catch (PDOException $e) {
        error_log('zipsite: cannot open the database ' . $dsn . ': ' . $e->getMessage());
        fail(503, 'the database is unavailable (see the server error log); check ZIPSITE_DSN and that the database server runs');
    }
}

// Degrees to radians written out (not deg2rad) so that the Python reference
// performs the very same floating-point operations.
function rad(float $deg): float
{
    return $deg * M_PI / 180.0;
}

// Haversine great-circle distance in miles (R. W. Sinnott, "Virtues of the
// Haversine", Sky and Telescope 68 (2), 1984).
function miles_between(float $lat1, float $lon1, float $lat2, float $lon2): float
{
    $p1 = rad($lat1);
    $p2 = rad($lat2);
    $dp = rad($lat2 - $lat1);
    $dl = rad($lon2 - $lon1);
    $a = sin($dp / 2.0) ** 2 + cos($p1) * cos($p2) * sin($dl / 2.0) ** 2;
    return 2.0 * EARTH_MILES * asin(min(1.0, sqrt($a)));
}

function h(string $s): string
{
    return htmlspecialchars($s, ENT_QUOTES | ENT_HTML5, 'UTF-8');
}

// The page "people within $r miles of $zip" ($miles as the client wrote it),
// shared by near.php and nearplace.php.
//
// A bounding box on (lat, lon) narrows the rows in the database (an index
// range scan), then the haversine distance in PHP keeps those inside the
// circle; ties in distance are ordered by person id.
function near_page(PDO $db, string $zip, string $miles, float $r): void
{
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
}
