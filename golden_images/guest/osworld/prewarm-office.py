"""Open (hidden) and close one empty Calc, Writer and Impress document in the running office, through its
UNO pipe, so each module's libraries are loaded before osfleet saves the running state."""

import sys
import time

import uno
from com.sun.star.beans import PropertyValue

hidden = PropertyValue()
hidden.Name, hidden.Value = "Hidden", True
local = uno.getComponentContext()
resolver = local.ServiceManager.createInstanceWithContext("com.sun.star.bridge.UnoUrlResolver", local)
ctx = resolver.resolve(f"uno:pipe,name={sys.argv[1]};urp;StarOffice.ComponentContext")
desktop = ctx.ServiceManager.createInstanceWithContext("com.sun.star.frame.Desktop", ctx)
for kind in ("scalc", "swriter", "simpress"):
    t0 = time.monotonic()
    doc = desktop.loadComponentFromURL(f"private:factory/{kind}", "_blank", 0, (hidden,))
    doc.close(True)
    print(f"{kind} loaded in {time.monotonic() - t0:.1f} s", flush=True)
