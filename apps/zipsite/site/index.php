<?php
// GET /: what the site does, and a few zip codes to start from.
declare(strict_types=1);
require __DIR__ . '/lib.php';

$q = db()->prepare('SELECT zip, name FROM place WHERE id % 1000 = 1 ORDER BY zip');
$q->execute();
header('Content-Type: text/html; charset=utf-8');
echo "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>zipsite</title></head>\n<body>\n",
    "<h1>People near a zip code</h1>\n<form action=\"/near.php\">Zip <input name=\"zip\" size=\"5\"> ",
    "within <input name=\"miles\" size=\"4\" value=\"10\"> miles <input type=\"submit\"></form>\n<ul>\n";
while (($r = $q->fetch(PDO::FETCH_NUM)) !== false) {
    echo "<li><a href=\"/near.php?zip=", h($r[0]), "&amp;miles=10\">", h($r[0]), " ", h($r[1]), "</a></li>\n";
}
echo "</ul>\n</body></html>\n";
