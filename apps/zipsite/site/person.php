<?php
// GET /person.php?id=N: one person, their place and picture.
declare(strict_types=1);
require __DIR__ . '/lib.php';

$id = $_GET['id'] ?? null;
if (!is_string($id) || !preg_match('/^[1-9][0-9]{0,8}$/D', $id)) {
    fail(400, 'id must be a person number, e.g. person.php?id=42');
}
$q = db()->prepare('SELECT pe.id, pe.name, pl.zip, pl.name, pl.lat, pl.lon
                      FROM person pe JOIN place pl ON pl.id = pe.place_id WHERE pe.id = ?');
$q->execute([(int) $id]);
$row = $q->fetch(PDO::FETCH_NUM);
if ($row === false) {
    fail(404, "no person with id $id");
}
[$pid, $name, $zip, $place, $lat, $lon] = $row;
header('Content-Type: text/html; charset=utf-8');
echo "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>", h($name), "</title></head>\n<body>\n",
    "<h1 id=\"person\" data-id=\"$pid\" data-zip=\"", h($zip), "\">", h($name), "</h1>\n",
    "<p><img src=\"/pics/$pid.png\" alt=\"\"></p>\n",
    "<p>Lives in ", h($place), " ", h($zip), " (", sprintf('%.6f', (float) $lat), ", ", sprintf('%.6f', (float) $lon), ")</p>\n",
    "<p><a href=\"/near.php?zip=", h($zip), "&amp;miles=10\">People within 10 miles</a></p>\n</body></html>\n";
