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
